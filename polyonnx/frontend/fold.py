"""Shape inference and constant folding over a loaded model's nodes.

Exporters (PyTorch above all) compute shapes at run time with ``Shape → Gather → Concat →
Reshape`` chains and materialise weights with ``Constant``/``ConstantOfShape`` nodes. When
the shapes are static, all of that is known at compile time: this pass evaluates it once,
so later stages see a ``Reshape`` with a constant shape and weights as plain constants.

The pass alternates ONNX shape inference (with data propagation) and one folding sweep
over the nodes, until a sweep folds nothing. Weights never go back into protobufs: the
model handed to shape inference carries only small constants as initializers (their values
feed data propagation) and declares big ones as typed graph inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from polyonnx.aligned import aligned
from polyonnx.errors import ModelError
from polyonnx.frontend.budget import (
    check_growth,
    check_sparse,
    check_types,
    growth_dims,
    propagation_is_safe,
)
from polyonnx.frontend.limits import Limits, resolve
from polyonnx.frontend.validate import validate_nodes

MAX_FOLD_ELEMENTS = 1 << 24
"""Outputs with more elements than this stay as nodes (a 64 MiB float32 tensor)."""

MAX_FILL_ELEMENTS = 1 << 28
"""The limit for ConstantOfShape, how exporters materialise weights: folded, its tensor
takes the memory its output buffer would take anyway, and it is not filled again on every
run (light VGG-19 fills a 25088 x 4096 classifier weight: 411 MB, 15 ms a run)."""

INFERENCE_VALUE_LIMIT = 1024
"""Constants up to this many elements are shown to shape inference with their values."""

DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})

NONDETERMINISTIC_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)

Types = Mapping[str, onnx.TypeProto]


@dataclass(frozen=True)
class Folded:
    """What is left after folding: the remaining nodes (still in topological order), every
    constant (initializers and folded tensors), and the types shape inference found."""

    nodes: tuple[onnx.NodeProto, ...]
    constants: Mapping[str, np.ndarray]
    types: Types


def fold_constants(
    model: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, np.ndarray],
    inputs: Sequence[onnx.ValueInfoProto],
    limits: Limits | None = None,
) -> Folded:
    """Fold every node of ``nodes`` whose outputs are computable at compile time.

    ``model`` supplies the opset imports, IR version, local functions, graph outputs and
    declared value_info; ``inputs`` are the real (non-constant) graph inputs, possibly with
    pinned dims. Neither is mutated. Every round checks the size budget (``budget.py``)
    before inference and before folding, so neither allocates a tensor over ``limits``;
    ONNX's data propagation runs only in rounds where it cannot materialise a big tensor.
    Node attributes are validated (``validate.py``) before a node is folded.
    """
    limits = resolve(limits)
    opsets = opset_map(model)
    remaining = list(nodes)
    known = dict(constants)
    types: Types = {}
    while True:
        check_growth(remaining, known, types, limits)
        data_prop = propagation_is_safe(remaining, known, types)
        types = infer_types(model, remaining, known, inputs, data_prop=data_prop)
        validate_nodes(remaining, known, types, opsets, limits)
        check_types(types, remaining, limits)
        check_growth(remaining, known, types, limits)
        kept = _fold_sweep(remaining, known, types, opsets)
        settled = len(kept) == len(remaining)
        if settled and (data_prop or not propagation_is_safe(kept, known, types)):
            return Folded(tuple(kept), MappingProxyType(known), MappingProxyType(types))
        remaining = kept  # settled without data propagation: once more with it, now safe


def opset_map(model: onnx.ModelProto) -> dict[str, int]:
    """The model's opset imports by domain, with 'ai.onnx' spelled as the default ''."""
    opsets = {}
    for entry in model.opset_import:
        domain = "" if entry.domain in DEFAULT_DOMAINS else entry.domain
        opsets[domain] = entry.version
    return opsets


def _as_declared(
    output: onnx.ValueInfoProto, inputs: Sequence[onnx.ValueInfoProto]
) -> onnx.ValueInfoProto:
    """A graph output as the skeleton declares it: an output that is a graph input takes
    the input's (pinned) type, not its own declared dims."""
    for info in inputs:
        if info.name == output.name:
            return info
    return output


def infer_types(
    model: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, np.ndarray],
    inputs: Sequence[onnx.ValueInfoProto],
    data_prop: bool = True,
) -> dict[str, onnx.TypeProto]:
    """Run ONNX shape inference (non-strict, with data propagation unless told not to)
    on ``nodes``.

    Returns the type of every top-level tensor inference could type, keyed by name.
    """
    skeleton = _inference_model(model, nodes, constants, inputs)
    try:
        inferred = onnx.shape_inference.infer_shapes(
            skeleton, check_type=False, strict_mode=False, data_prop=data_prop
        )
    except Exception as exc:
        raise ModelError(
            f"ONNX shape inference failed on model {model.graph.name!r}: {exc}"
        ) from exc
    graph = inferred.graph
    types = {}
    given = {info.name for info in graph.input}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.WhichOneof("value") is not None and not (
            info.name in given and info.name in types
        ):  # an input that is also an output keeps the input's (pinned) type
            types[info.name] = info.type
    return types


def _inference_model(
    model: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, np.ndarray],
    inputs: Sequence[onnx.ValueInfoProto],
) -> onnx.ModelProto:
    """A weightless copy of the model for shape inference: small constants as
    initializers, large ones as typed inputs, declared value_info kept as hints."""
    small = {k: v for k, v in constants.items() if v.size <= INFERENCE_VALUE_LIMIT}
    large = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in constants.items()
        if k not in small
    ]
    hints = [v for v in model.graph.value_info if v.name not in constants]
    graph = helper.make_graph(
        nodes,
        model.graph.name or "graph",
        [*inputs, *large],
        [_as_declared(out, inputs) for out in model.graph.output],
        initializer=[numpy_helper.from_array(v, k) for k, v in small.items()],
        value_info=hints,
    )
    skeleton = helper.make_model(
        graph,
        opset_imports=list(model.opset_import),
        ir_version=max(model.ir_version, 4),
        functions=list(model.functions),
    )
    return skeleton


def _fold_sweep(
    nodes: Sequence[onnx.NodeProto],
    constants: dict[str, np.ndarray],
    types: Types,
    opsets: Mapping[str, int],
) -> list[onnx.NodeProto]:
    """Fold what can be folded in one pass in order; adds results to ``constants``
    (the caller's working dict) and returns the nodes that remain."""
    kept = []
    for node in nodes:
        outputs = evaluate_node(node, constants, types, opsets)
        if outputs is None:
            kept.append(node)
            continue
        for name, array in outputs.items():
            constants[name] = aligned(array)  # polyonnx/aligned.py
            constants[name].flags.writeable = False
    return kept


def evaluate_node(
    node: onnx.NodeProto,
    constants: Mapping[str, np.ndarray],
    types: Types,
    opsets: Mapping[str, int],
) -> dict[str, np.ndarray] | None:
    """The outputs of ``node`` when they are known at compile time, else None."""
    if node.domain not in DEFAULT_DOMAINS or _has_subgraph(node):
        return None
    if node.op_type == "Constant":
        return _fold_constant_node(node)
    if node.op_type in ("Shape", "Size"):
        return _fold_shape(node, constants, types)
    if not _is_deterministic(node, constants):
        return None
    if not all(name in constants for name in node.input if name):
        return None
    if _would_be_too_big(node, constants, types):
        return None
    return _run_reference(node, constants, types, opsets)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    """If/Loop/Scan bodies may read outer-scope tensors that are not node inputs."""
    graph_kinds = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    return any(attr.type in graph_kinds for attr in node.attribute)


def _is_deterministic(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> bool:
    """Random ops never fold; Dropout folds only when it is known to be in inference mode."""
    if node.op_type in NONDETERMINISTIC_OPS:
        return False
    if node.op_type != "Dropout" or len(node.input) < 3 or not node.input[2]:
        return True
    training = constants.get(node.input[2])
    return training is not None and not bool(training)


def _fold_constant_node(node: onnx.NodeProto) -> dict[str, np.ndarray] | None:
    """A ``Constant`` node's value, whichever ``value*`` attribute holds it."""
    attr = node.attribute[0] if len(node.attribute) == 1 else None
    if attr is None:
        return None
    value = helper.get_attribute_value(attr)
    if attr.name == "value":
        try:
            array = numpy_helper.to_array(value)
        except Exception as exc:
            raise ModelError(f"Constant node {node.name!r}: cannot read its value: {exc}") from exc
    elif attr.name == "sparse_value":
        array = densify(value)
    elif attr.name in ("value_float", "value_floats"):
        array = np.array(value, dtype=np.float32)
    elif attr.name in ("value_int", "value_ints"):
        array = np.array(value, dtype=np.int64)
    elif attr.name in ("value_string", "value_strings"):
        array = np.array(_decode(value), dtype=object)
    else:
        return None
    return {node.output[0]: array}


def _decode(value: bytes | list[bytes]) -> str | bytes | list[str | bytes]:
    """UTF-8 text as str; bytes that are not UTF-8 stay bytes."""
    if isinstance(value, list):
        return [_decode(v) for v in value]
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def densify(sparse: onnx.SparseTensorProto, limits: Limits | None = None) -> np.ndarray:
    """A sparse tensor as a dense array (indices are linear [NNZ] or coordinates [NNZ, r]),
    after checking its indices against its dims and, when given, its size against
    ``limits`` (``load_model`` has checked every tensor of the model already)."""
    what = f"sparse tensor {sparse.values.name!r}"
    if limits is not None:
        check_sparse(sparse, limits, what)
    try:
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices)
    except Exception as exc:
        raise ModelError(f"cannot read {what}: {exc}") from exc
    dims = tuple(int(d) for d in sparse.dims)
    linear = indices.ndim == 1
    bound = [math.prod(dims)] if linear else list(dims)
    if values.ndim != 1 or indices.dtype.kind not in "iu" or indices.ndim not in (1, 2):
        raise ModelError(f"{what}: values must be 1-D and indices integer [NNZ] or [NNZ, rank]")
    if len(indices) != len(values) or (not linear and indices.shape[1] != len(dims)):
        raise ModelError(
            f"{what}: indices of shape {list(indices.shape)} do not match "
            f"{len(values)} values of a rank-{len(dims)} tensor"
        )
    column = indices.reshape(len(indices), -1)
    if column.size and ((column < 0).any() or (column >= np.array(bound)).any()):
        raise ModelError(f"{what}: an index lies outside its dims {list(dims)}")
    dense = np.zeros(dims, dtype=values.dtype)
    if linear:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def _fold_shape(
    node: onnx.NodeProto, constants: Mapping[str, np.ndarray], types: Types
) -> dict[str, np.ndarray] | None:
    """``Shape`` (with start/end) and ``Size`` of a tensor whose needed dims are static."""
    source = node.input[0]
    dims = list(constants[source].shape) if source in constants else static_dims(types.get(source))
    if node.op_type == "Size":
        if dims is None or any(d is None for d in dims):
            return None
        return {node.output[0]: np.array(math.prod(dims), dtype=np.int64)}
    if dims is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start = attrs.get("start", 0)
    end = attrs.get("end")
    picked = dims[start:end]
    if any(d is None for d in picked):
        return None
    return {node.output[0]: np.array(picked, dtype=np.int64)}


def static_dims(type_proto: onnx.TypeProto | None) -> list[int | None] | None:
    """A tensor type's dims, None for each unknown dim; None when the rank is unknown."""
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]


def _would_be_too_big(
    node: onnx.NodeProto, constants: Mapping[str, np.ndarray], types: Types
) -> bool:
    """True when an output is known, before evaluating, to exceed MAX_FOLD_ELEMENTS:
    from inferred types, or for growth ops (Range, ConstantOfShape: how weights get
    materialised, ...) from their constant inputs."""
    limit = _fold_limit(node)
    grown = growth_dims(node, constants, types)
    if grown is not None:
        return None in grown or math.prod(grown) > limit
    for name in node.output:
        dims = static_dims(types.get(name)) if name else None
        if dims and None not in dims and math.prod(dims) > limit:
            return True
    return False


def _fold_limit(node: onnx.NodeProto) -> int:
    return MAX_FILL_ELEMENTS if node.op_type == "ConstantOfShape" else MAX_FOLD_ELEMENTS


def _run_reference(
    node: onnx.NodeProto,
    constants: Mapping[str, np.ndarray],
    types: Types,
    opsets: Mapping[str, int],
) -> dict[str, np.ndarray] | None:
    """Evaluate one node with onnx's reference evaluator; None if it cannot be evaluated
    or a result is not a plain tensor matching what shape inference predicted."""
    feeds = {name: constants[name] for name in node.input if name}
    graph = helper.make_graph(
        [node],
        "fold",
        [helper.make_value_info(name, onnx.TypeProto()) for name in feeds],
        [helper.make_value_info(name, onnx.TypeProto()) for name in node.output if name],
    )
    try:
        results = ReferenceEvaluator(graph, opsets=dict(opsets)).run(None, feeds)
    except Exception:
        return None
    outputs = {}
    for name, result in zip([n for n in node.output if n], results, strict=True):
        array = _checked_result(result, types.get(name), _fold_limit(node))
        if array is None:
            return None
        outputs[name] = array
    return outputs


def _checked_result(
    result: object, expected: onnx.TypeProto | None, limit: int = MAX_FOLD_ELEMENTS
) -> np.ndarray | None:
    """The result as an array in the inferred dtype, or None when it cannot be trusted."""
    if isinstance(result, np.generic):
        result = np.asarray(result)
    if not isinstance(result, np.ndarray) or result.size > limit:
        return None
    result = result if result.flags.c_contiguous else result.copy(order="C")
    dims = static_dims(expected)
    if dims is None:
        return result
    if len(dims) != result.ndim:
        return None
    if any(d is not None and d != s for d, s in zip(dims, result.shape, strict=True)):
        return None
    elem = expected.tensor_type.elem_type
    if not elem or elem == onnx.TensorProto.STRING:
        return result
    return result.astype(helper.tensor_dtype_to_np_dtype(elem), copy=False)
