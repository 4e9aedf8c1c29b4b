"""Check a model's tensors against the size budget (``limits.py``) before allocating them.

Three places can make a tensor: the protobuf (initializers, sparse initializers, Constant
attributes, external data), shape inference (a Conv with huge pads, a Resize by 1e6) and
the ops whose output size is computed from the *values* of small inputs (Range,
ConstantOfShape, Expand, Tile, Resize, Pad, OneHot). Each is checked from dims alone:
``check_model_tensors`` on the proto before any tensor is converted, ``check_types`` on
what inference found, and ``check_growth`` on the growth ops before inference or folding
evaluates them. ``propagation_is_safe`` says whether ONNX's data propagation (which
materialises the values of integer Range/ConstantOfShape/Expand/Tile outputs in C++) may
run: only when every such output is known to be small.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from polyonnx.errors import ModelError
from polyonnx.frontend.limits import Limits

PROPAGATION_LIMIT = 1 << 16
"""ONNX's data propagation runs only while every integer output of a growth op has at most
this many elements (shape tensors have a handful; the C++ copies cost 8+ bytes each)."""

GROWTH_OPS = frozenset(
    {"Range", "ConstantOfShape", "Expand", "Tile", "Resize", "Upsample", "Pad", "OneHot"}
)
"""Ops whose output size is set by the values of inputs, not by their sizes."""

KNOWN_DTYPES = frozenset(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}

Types = Mapping[str, onnx.TypeProto]
Dims = list[int | None]


def itemsize(elem_type: int) -> int:
    """Bytes per element of an ONNX dtype (at least 1: int4 packs two in a byte)."""
    if elem_type == onnx.TensorProto.STRING:
        return 8
    try:
        return max(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize, 1)
    except (KeyError, TypeError, ValueError):
        return 1


def check_elem_type(elem_type: int, what: str) -> None:
    if elem_type not in KNOWN_DTYPES:
        raise ModelError(f"{what} has data_type {elem_type}, which is not an ONNX tensor type")


def check_tensor(tensor: onnx.TensorProto, limits: Limits, what: str) -> None:
    """A tensor proto's dtype and dims, from its header only (no data is read)."""
    check_elem_type(tensor.data_type, what)
    limits.check_dims(list(tensor.dims), itemsize(tensor.data_type), what)


def check_sparse(sparse: onnx.SparseTensorProto, limits: Limits, what: str) -> None:
    """A sparse tensor's dense shape, values and indices, before it is densified."""
    check_elem_type(sparse.values.data_type, what)
    limits.check_dims(list(sparse.dims), itemsize(sparse.values.data_type), what)
    check_tensor(sparse.values, limits, f"{what} (values)")
    check_tensor(sparse.indices, limits, f"{what} (indices)")


def check_model_tensors(model: onnx.ModelProto, limits: Limits) -> None:
    """Every tensor the proto holds, in the main graph, subgraphs and functions."""
    for where, graph in _graphs(model):
        for tensor in graph.initializer:
            check_tensor(tensor, limits, f"initializer {tensor.name!r}{where}")
        for sparse in graph.sparse_initializer:
            check_sparse(sparse, limits, f"sparse initializer {sparse.values.name!r}{where}")
        _check_node_tensors(graph.node, limits, where)
    for function in model.functions:
        _check_node_tensors(function.node, limits, f" in function {function.name!r}")


def _check_node_tensors(nodes: Iterable[onnx.NodeProto], limits: Limits, where: str) -> None:
    for node in nodes:
        for attr in node.attribute:
            what = f"attribute {attr.name!r} of {node.op_type} node {node.name!r}{where}"
            if attr.type == onnx.AttributeProto.TENSOR:
                check_tensor(attr.t, limits, what)
            elif attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                check_sparse(attr.sparse_tensor, limits, what)
            for tensor in attr.tensors:
                check_tensor(tensor, limits, what)
            for sparse in attr.sparse_tensors:
                check_sparse(sparse, limits, what)


def _graphs(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The main graph and every subgraph, each with where it is ('' for the main one)."""
    stack = [("", model.graph)]
    while stack:
        where, graph = stack.pop()
        yield where, graph
        for node in graph.node:
            for attr in node.attribute:
                inner = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs
                for sub in inner:
                    stack.append((f" in a subgraph of node {node.name!r}", sub))


def check_types(types: Types, nodes: Sequence[onnx.NodeProto], limits: Limits) -> None:
    """Every typed tensor: a known dtype and dims within budget. One error lists them all."""
    producer = {name: node for node in nodes for name in node.output}
    problems = []
    for name, type_proto in types.items():
        if type_proto.WhichOneof("value") != "tensor_type":
            continue
        tensor = type_proto.tensor_type
        what = _describe(name, producer.get(name))
        if tensor.elem_type and tensor.elem_type not in KNOWN_DTYPES:
            problems.append(f"{what} has data_type {tensor.elem_type}, not an ONNX tensor type")
            continue
        if not tensor.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if any(d is not None and d < 0 for d in dims):
            continue  # onnx's inference gives -1 for dims it cannot tell (a Split's last part)
        problem = limits.problem(dims, itemsize(tensor.elem_type))
        if problem:
            problems.append(f"{what} {problem}")
    _raise(problems)


def check_growth(
    nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, np.ndarray],
    types: Types,
    limits: Limits,
) -> None:
    """The outputs of growth ops whose sizing inputs are constants, before anything
    (inference, folding, lowering) computes them."""
    problems = []
    for node in nodes:
        dims = growth_dims(node, constants, types)
        if dims is None or any(d is not None and d < 0 for d in dims):
            continue  # negative dims allocate nothing; validate.py says what is wrong
        problem = limits.problem(dims, _output_itemsize(node, constants, types))
        if problem:
            problems.append(f"{_describe(node.output[0], node)} {problem}")
    _raise(problems)


def propagation_is_safe(
    nodes: Sequence[onnx.NodeProto], constants: Mapping[str, np.ndarray], types: Types
) -> bool:
    """True unless ONNX's data propagation may materialise a big Range, ConstantOfShape or
    Expand output: each one's sizing values must be known small, or depend on a symbolic
    dim (which ONNX cannot materialise either), as ``shape_values`` follows them."""
    known = shape_values(nodes, constants, types)
    for node in nodes:
        if node.domain not in ("", "ai.onnx") or node.op_type not in PROPAGATING_OPS:
            continue
        sizing = PROPAGATING_OPS[node.op_type]
        values = [known.get(node.input[i]) if i < len(node.input) else None for i in sizing]
        if any(v is None for v in values):
            return False  # not followed: it may be static and big
        if any(None in v for v in values):
            continue  # symbolic
        dims = growth_dims(node, {**constants, **_arrays(node, sizing, values)}, types)
        if dims is None or None in dims or math.prod(dims) > PROPAGATION_LIMIT:
            return False
    return True


PROPAGATING_OPS = {"Range": (0, 1, 2), "ConstantOfShape": (0,), "Expand": (1,)}
"""Ops whose ONNX data propagation computes their output values, and the inputs that size
them (onnx 1.23 allocated 2.7 GB for a ConstantOfShape or Expand of [2**40])."""

Partial = list[int | None]
"""The values of a small integer tensor as far as they are known (None: symbolic)."""


def shape_values(
    nodes: Sequence[onnx.NodeProto], constants: Mapping[str, np.ndarray], types: Types
) -> dict[str, Partial]:
    """The values of the small integer tensors that shape computations pass around
    (Shape, Gather, Concat, Slice, Squeeze/Unsqueeze, Cast, arithmetic), in node order:
    our own data propagation, which never allocates more than its inputs' lengths."""
    known: dict[str, Partial] = {
        name: [int(v) for v in array.reshape(-1)]
        for name, array in constants.items()
        if array.dtype.kind in "iu" and array.ndim <= 1 and array.size <= PROPAGATION_LIMIT
    }
    for node in nodes:
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        try:
            value = _propagate(node, known, types)
        except (ArithmeticError, ValueError, TypeError, IndexError, KeyError):
            value = None
        if value is not None and len(value) <= PROPAGATION_LIMIT:
            known[node.output[0]] = value
    return known


def _propagate(node: onnx.NodeProto, known: Mapping[str, Partial], types: Types) -> Partial | None:
    """One node's output values from its inputs' (None when not followed)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ins = [known.get(name) for name in node.input]
    op = node.op_type
    if op == "Shape":
        dims = _Reader(node, {}, types).dims(0)
        return None if dims is None else dims[attrs.get("start", 0) : attrs.get("end")]
    if op == "Size":
        dims = _Reader(node, {}, types).dims(0)
        return None if dims is None else [None if None in dims else math.prod(dims)]
    if any(v is None for v in ins[:1]):
        return None
    if op in ("Identity", "Cast", "Squeeze", "Unsqueeze"):
        return list(ins[0])
    if op == "Concat":
        return None if any(v is None for v in ins) else [x for v in ins for x in v]
    if op == "Gather" and len(ins) > 1 and ins[1] is not None and None not in ins[1]:
        return [ins[0][i] for i in ins[1]]
    if op == "Slice" and all(v is not None and None not in v for v in ins[1:]):
        starts, ends = ins[1], ins[2]
        step = ins[4][0] if len(ins) > 4 else 1
        return ins[0][starts[0] : ends[0] : step]
    if op in _ARITHMETIC and len(ins) == 2 and ins[1] is not None:
        a, b = ins
        if len(a) != len(b):
            a, b = (a * len(b), b) if len(a) == 1 else (a, b * len(a))
        pairs = zip(a, b, strict=True)
        return [None if x is None or y is None else _ARITHMETIC[op](x, y) for x, y in pairs]
    return None


_ARITHMETIC = {
    "Add": lambda x, y: x + y,
    "Sub": lambda x, y: x - y,
    "Mul": lambda x, y: x * y,
    "Div": lambda x, y: None if y == 0 else abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1),
}


def _arrays(node: onnx.NodeProto, sizing: Sequence[int], values: Sequence[Partial]):
    return {node.input[i]: np.array(v, np.int64) for i, v in zip(sizing, values, strict=True)}


def _raise(problems: Sequence[str]) -> None:
    if not problems:
        return
    shown = "\n  ".join(problems[:8])
    more = f"\n  and {len(problems) - 8} more" if len(problems) > 8 else ""
    heading = "the model exceeds the size budget"
    if all("not an ONNX tensor type" in p for p in problems):
        heading = "the model has tensors of unknown types"
    raise ModelError(f"{heading}:\n  {shown}{more}")


def _describe(name: str, node: onnx.NodeProto | None) -> str:
    if node is None:
        return f"tensor {name!r}"
    return f"tensor {name!r} (output of {node.op_type} node {node.name!r})"


# ---- output dims of growth ops -----------------------------------------------------------


def growth_dims(
    node: onnx.NodeProto, constants: Mapping[str, np.ndarray], types: Types
) -> Dims | None:
    """The first output's dims as the sizing inputs' values give them (None per unknown
    dim), or None when those inputs are not constants or ``node`` is no growth op."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in GROWTH_OPS:
        return None
    try:
        return _GROWTH[node.op_type](node, _Reader(node, constants, types))
    except (ArithmeticError, ValueError, TypeError, IndexError):
        return None


class _Reader:
    """A node's constant inputs and input dims, by input index."""

    def __init__(self, node: onnx.NodeProto, constants: Mapping[str, np.ndarray], types: Types):
        self.node, self.constants, self.types = node, constants, types
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def value(self, index: int) -> np.ndarray | None:
        name = self.node.input[index] if index < len(self.node.input) else ""
        return self.constants.get(name) if name else None

    def dims(self, index: int) -> Dims | None:
        name = self.node.input[index] if index < len(self.node.input) else ""
        return value_dims(name, self.constants, self.types)


def value_dims(name: str, constants: Mapping[str, np.ndarray], types: Types) -> Dims | None:
    """The dims of value ``name`` (None per unknown dim), or None where its rank is unknown
    (or ``name`` is empty: an omitted optional input)."""
    if not name:
        return None
    if name in constants:
        return [int(d) for d in constants[name].shape]
    type_proto = types.get(name)
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    if not type_proto.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else None for d in type_proto.tensor_type.shape.dim
    ]


def _ints(array: np.ndarray | None) -> list[int] | None:
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def _range(node: onnx.NodeProto, read: _Reader) -> Dims | None:
    values = [read.value(i) for i in range(3)]
    if any(v is None or v.size != 1 for v in values):
        return None
    start, limit, delta = (v.reshape(-1)[0].item() for v in values)
    if delta == 0:
        raise_model(node, "delta is 0: the output would never end")
    if isinstance(start + limit + delta, int):
        return [max(-((start - limit) // delta), 0)]
    count = (limit - start) / delta
    if not math.isfinite(count):
        raise_model(node, f"start {start}, limit {limit}, delta {delta} give no finite length")
    return [max(math.ceil(count), 0)]


def _constant_of_shape(node: onnx.NodeProto, read: _Reader) -> Dims | None:
    return _ints(read.value(0))


def _expand(node: onnx.NodeProto, read: _Reader) -> Dims | None:
    shape, dims = _ints(read.value(1)), read.dims(0)
    if shape is None or dims is None:
        return None
    rank = max(len(shape), len(dims))
    shape = [1] * (rank - len(shape)) + shape
    dims = [1] * (rank - len(dims)) + dims
    return [None if d is None else max(d, s) for d, s in zip(dims, shape, strict=True)]


def _tile(node: onnx.NodeProto, read: _Reader) -> Dims | None:
    repeats, dims = _ints(read.value(1)), read.dims(0)
    if repeats is None or dims is None or len(repeats) != len(dims):
        return None
    return [None if d is None else d * r for d, r in zip(dims, repeats, strict=True)]


def _resize(node: onnx.NodeProto, read: _Reader) -> Dims | None:
    dims = read.dims(0)
    if node.op_type == "Resize" and len(node.input) > 3 and node.input[3]:
        sizes = _ints(read.value(3))
        if sizes is None or dims is None:
            return sizes
        return _on_axes(dims, sizes, read.attrs.get("axes"))
    if "scales" in read.attrs:
        scales = [float(s) for s in read.attrs["scales"]]
    else:
        index = 2 if node.op_type == "Resize" and len(node.input) > 2 else 1
        value = read.value(index)
        scales = None if value is None else [float(s) for s in value.reshape(-1)]
    if not scales or dims is None:
        return None
    scaled = _on_axes(dims, scales, read.attrs.get("axes"))
    return [None if d is None else math.floor(d) for d in scaled]


def _on_axes(dims: Dims, given: Sequence, axes: Sequence[int] | None) -> list:
    """``dims`` with ``given`` applied on ``axes`` (all axes when None): sizes replace,
    scales multiply (floats)."""
    axes = list(range(len(dims))) if axes is None else [a % len(dims) for a in axes]
    if len(axes) != len(given):
        raise ValueError("axes and sizes differ in length")
    out: list = list(dims)
    for axis, g in zip(axes, given, strict=True):
        if isinstance(g, float):
            out[axis] = None if dims[axis] is None else dims[axis] * g
        else:
            out[axis] = g
    return out


def _pad(node: onnx.NodeProto, read: _Reader) -> Dims | None:
    pads = read.attrs.get("pads", read.attrs.get("paddings"))
    pads = list(pads) if pads is not None else _ints(read.value(1))
    dims = read.dims(0)
    if pads is None or dims is None:
        return None
    axes = None
    if len(node.input) > 3 and node.input[3]:
        axes = _ints(read.value(3))
        if axes is None:
            return None  # axes given at run time
    axes = list(range(len(dims))) if axes is None else [a % len(dims) for a in axes]
    if len(pads) != 2 * len(axes):
        return None
    out = list(dims)
    for i, axis in enumerate(axes):
        if out[axis] is not None:
            out[axis] = max(out[axis] + pads[i] + pads[i + len(axes)], 0)
    return out


def _one_hot(node: onnx.NodeProto, read: _Reader) -> Dims | None:
    depth, dims = read.value(1), read.dims(0)
    if depth is None or depth.size != 1 or dims is None:
        return None
    axis = int(read.attrs.get("axis", -1))
    axis = axis + len(dims) + 1 if axis < 0 else axis
    return [*dims[:axis], math.floor(float(depth.reshape(-1)[0])), *dims[axis:]]


_GROWTH = {
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Resize": _resize,
    "Upsample": _resize,
    "Pad": _pad,
    "OneHot": _one_hot,
}


def raise_model(node: onnx.NodeProto, why: str) -> None:
    raise ModelError(f"{node.op_type} node {node.name!r}: {why}")


def _output_elem(node: onnx.NodeProto, constants: Mapping[str, np.ndarray], types: Types) -> int:
    """The output's ONNX dtype as far as it is known before inference (0 when not)."""
    if node.op_type == "ConstantOfShape":
        for attr in node.attribute:
            if attr.name == "value":
                return attr.t.data_type
        return onnx.TensorProto.FLOAT
    if node.op_type == "OneHot":
        name = node.input[2] if len(node.input) > 2 else ""
    else:
        name = node.input[0] if node.input else ""
    if name in constants:
        return helper.np_dtype_to_tensor_dtype(constants[name].dtype)
    type_proto = types.get(name)
    if type_proto is not None and type_proto.WhichOneof("value") == "tensor_type":
        return type_proto.tensor_type.elem_type
    return 0


def _output_itemsize(
    node: onnx.NodeProto, constants: Mapping[str, np.ndarray], types: Types
) -> int:
    elem = _output_elem(node, constants, types)
    return itemsize(elem) if elem else 1
