"""Load an ONNX model and turn it into an immutable :class:`Graph`.

``load_model`` reads and checks the protobuf (path, bytes or proto); ``load_graph`` pins
input dims if asked, runs shape inference and constant folding (``fold.py``), checks the
remaining ops against what the caller supports, and converts everything to plain Python
and numpy so no later stage needs protobufs.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import onnx
import onnx.version_converter
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx import external_data_helper, helper, numpy_helper

from polyonnx.aligned import aligned
from polyonnx.errors import InputError, ModelError, UnsupportedOpError
from polyonnx.frontend.budget import check_model_tensors, check_tensor
from polyonnx.frontend.dedupe import merge_duplicates
from polyonnx.frontend.fold import DEFAULT_DOMAINS, Folded, densify, fold_constants, opset_map
from polyonnx.frontend.graph import AttrValue, Dim, Graph, Node, Value
from polyonnx.frontend.limits import Limits, resolve

OLDEST_OPSET = 7
"""The oldest default-domain opset polyonnx accepts."""

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


def load_model(model: ModelSource, *, limits: Limits | None = None) -> onnx.ModelProto:
    """Read ``model`` (a path, serialized bytes or a proto) and check it.

    A path's external data is resolved relative to the model's directory, and the checker
    runs on the path so models over 2 GB work. A proto passed in is copied, never mutated.
    Every tensor's dtype and dims are checked against ``limits`` (default
    :meth:`Limits.from_env`, docs/limits.md) before any data is read, external data
    included. Every failure raises :class:`ModelError` naming the file (and the node or
    tensor, when there is one).
    """
    limits = resolve(limits)
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        _check_proto(proto, "the given ModelProto", limits)
        _run_checker(proto, "the given ModelProto")
        return _check_opset(proto, "the given ModelProto")
    if isinstance(model, bytes | bytearray | memoryview):
        return _load_bytes(bytes(model), limits)
    if isinstance(model, str | os.PathLike):
        return _load_path(os.fspath(model), limits)
    raise ModelError(
        f"cannot load a model from a {type(model).__name__}; give a path, bytes or ModelProto"
    )


def model_digest(model: ModelSource) -> str:
    """SHA-256 of a model's content: a path's file and the external data files it names
    (hashing the bytes on disk: serialising a BERT-base's proto again took 1.2 s), the
    bytes given, or a proto's serialisation."""
    if isinstance(model, onnx.ModelProto):
        return hashlib.sha256(model.SerializeToString()).hexdigest()
    if isinstance(model, bytes | bytearray | memoryview):
        return hashlib.sha256(model).hexdigest()
    path = os.fspath(model)
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data)
    proto = onnx.load_model_from_string(data)  # external data is not read from bytes
    base_dir = os.path.dirname(os.path.abspath(path))
    locations = {
        entry.value
        for tensor in external_data_helper._get_all_tensors(proto)
        if external_data_helper.uses_external_data(tensor)
        for entry in tensor.external_data
        if entry.key == "location"
    }
    for location in sorted(locations):  # load_model has refused any outside base_dir
        digest.update(location.encode())
        with open(os.path.join(base_dir, location), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _load_bytes(data: bytes, limits: Limits) -> onnx.ModelProto:
    source = f"the given {len(data)} bytes"
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as exc:
        raise ModelError(f"{source} are not a valid ONNX protobuf: {exc}") from exc
    _check_proto(proto, source, limits)
    _run_checker(proto, source)
    return _check_opset(proto, source)


def _load_path(path: str, limits: Limits) -> onnx.ModelProto:
    if not os.path.isfile(path):
        raise ModelError(f"model file not found: {path!r}")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as exc:
        raise ModelError(f"{path!r} is not a valid ONNX protobuf: {exc}") from exc
    _check_proto(proto, repr(path), limits)
    _run_checker(path, repr(path))
    base_dir = os.path.dirname(os.path.abspath(path))
    try:
        external_data_helper.load_external_data_for_model(proto, base_dir)
    except Exception as exc:
        raise ModelError(
            f"cannot read the external data of {path!r} (from {base_dir!r}): {exc}"
        ) from exc
    return _check_opset(proto, repr(path))


def _check_proto(proto: onnx.ModelProto, source: str, limits: Limits) -> None:
    """Text fields that are valid UTF-8 and tensors within ``limits``, from headers only."""
    _check_text(proto, source, "model")
    try:
        check_model_tensors(proto, limits)
    except ModelError as exc:
        raise ModelError(f"{source}: {exc}") from None


def _check_text(message: Message, source: str, where: str) -> None:
    """Every string field of ``message`` and the messages in it decodes as UTF-8.

    protobuf hands back an invalid string as bytes, so a bad byte would otherwise
    surface as a UnicodeDecodeError wherever a name is next written (shape inference's
    copy of the graph). Tensor data is bytes, never decoded.
    """
    try:
        fields = _text_fields(message)
    except UnicodeDecodeError:
        raise ModelError(f"{source}: a text field of {where} is not valid UTF-8") from None
    for field, value in fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            texts = value if field.is_repeated else [value]
            bad = next((t for t in texts if not isinstance(t, str)), None)
            if bad is not None:
                raise ModelError(
                    f"{source}: {where}.{field.name} is not valid UTF-8: {bytes(bad)!r}"
                )
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if not field.is_repeated:
            _check_text(value, source, f"{where}.{field.name}")
            continue
        for index, item in enumerate(value):
            _check_text(item, source, f"{where}.{field.name}[{index}]")


def _text_fields(message: Message) -> list:
    """``message``'s set fields; a tensor's data fields are left out (reading raw_data
    would copy the weights)."""
    if not isinstance(message, onnx.TensorProto):
        return message.ListFields()
    by_name = onnx.TensorProto.DESCRIPTOR.fields_by_name
    wanted = ("name", "doc_string", "external_data", "metadata_props")
    return [(by_name[name], getattr(message, name)) for name in wanted]


def _run_checker(model: onnx.ModelProto | str, source: str) -> None:
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ModelError(f"{source} fails the ONNX checker: {exc}") from exc


def _check_opset(proto: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """Models older than opset 7 are converted with onnx's version converter; models
    newer than this onnx knows, or with no default-domain opset, are refused."""
    opset = opset_map(proto).get("")
    newest = onnx.defs.onnx_opset_version()
    if opset is None:
        raise ModelError(f"{source} imports no default-domain ONNX opset")
    if opset < OLDEST_OPSET:
        try:
            return onnx.version_converter.convert_version(proto, OLDEST_OPSET)
        except Exception as exc:
            raise ModelError(
                f"{source} uses opset {opset}; polyonnx needs opset {OLDEST_OPSET} or newer, "
                f"and onnx's version converter could not convert it: {exc}"
            ) from exc
    if opset > newest:
        raise ModelError(
            f"{source} uses opset {opset}, newer than the newest onnx {onnx.__version__} defines "
            f"({newest})"
        )
    return proto


def load_graph(
    model: ModelSource,
    *,
    supported_ops: Collection[str] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    checked: bool = False,
    limits: Limits | None = None,
    merge: bool = True,
) -> Graph:
    """Load, check, shape-infer and constant-fold ``model`` into an immutable Graph.

    ``input_shapes`` pins graph input dims (to specialise models with symbolic dims);
    ``input_values`` turns graph inputs into constants (to specialise on the values of
    small inputs that decide shapes or axes, e.g. a Reshape's target shape); equal
    constants and nodes that compute the same are merged (``dedupe.py``; ``merge=False``
    keeps them apart, so that graphs of one model at different shapes share names);
    ``supported_ops`` (op types, ``"domain.Op"`` outside the default domain) makes every
    op left after folding that is not in it fail in one :class:`UnsupportedOpError`.
    Bad ``input_shapes`` (unknown input, wrong rank, clash with a static dim) raise
    :class:`InputError`; everything wrong with the model itself raises ModelError.
    ``checked``: ``model`` is a ModelProto that :func:`load_model` returned, read as it
    is (not copied or checked again: a BERT-base's checker run took a second).
    ``limits`` bounds every tensor the model declares or computes (docs/limits.md; default
    :meth:`Limits.from_env`); node attributes are validated per op (``validate.py``).
    """
    limits = resolve(limits)
    if checked and isinstance(model, onnx.ModelProto):
        proto = model
        check_model_tensors(proto, limits)
    else:
        proto = load_model(model, limits=limits)
    constants = _initializers(proto.graph, limits)
    inputs = [info for info in proto.graph.input if info.name not in constants]
    inputs = _pin_inputs(inputs, input_shapes or {})
    pinned = _pin_values(inputs, input_values or {})
    constants.update(pinned)
    inputs = [info for info in inputs if info.name not in pinned]
    nodes = _name_nodes(proto.graph.node)
    folded = fold_constants(proto, nodes, constants, inputs, limits)
    if supported_ops is not None:
        _check_supported(folded.nodes, supported_ops)
    graph = _build_graph(proto, [info.name for info in inputs], folded)
    _check_no_strings(graph)
    return merge_duplicates(graph) if merge else graph


def _initializers(graph: onnx.GraphProto, limits: Limits) -> dict[str, np.ndarray]:
    """Dense and sparse initializers as read-only numpy arrays, each checked against
    ``limits`` before it is converted."""
    arrays = {}
    for tensor in graph.initializer:
        check_tensor(tensor, limits, f"initializer {tensor.name!r}")
        arrays[tensor.name] = _tensor_array(tensor, tensor.name)
    for sparse in graph.sparse_initializer:
        arrays[sparse.values.name] = _readonly(densify(sparse, limits))
    return arrays


def _check_no_strings(graph: Graph) -> None:
    """String tensors that reach a node or are graph inputs are refused: no lowering
    handles them (string constants folded away, or returned as outputs, are fine)."""
    users: dict[str, list[str]] = {v.name: ["graph input"] for v in graph.inputs}
    for node in graph.nodes:
        for name in [*node.inputs, *node.outputs]:
            users.setdefault(name, []).append(f"{node.op_type} node {node.name!r}")
    strings = [
        name for name, value in graph.values.items() if value.dtype == "object" and name in users
    ]
    if not strings:
        return
    lines = [f"  tensor {name!r} ({', '.join(users[name])})" for name in strings[:8]]
    raise ModelError(
        f"polyonnx does not compile string tensors; the model has {len(strings)}:\n"
        + "\n".join(lines)
    )


def _tensor_array(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    try:
        return _readonly(numpy_helper.to_array(tensor))
    except Exception as exc:
        raise ModelError(f"cannot read tensor {what!r}: {exc}") from exc


def _readonly(array: np.ndarray) -> np.ndarray:
    """``array`` read-only, at a cache line (polyonnx/aligned.py)."""
    array = aligned(array)
    array.flags.writeable = False
    return array


def _pin_values(
    inputs: Sequence[onnx.ValueInfoProto], values: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Read-only copies of ``values``, checked to name graph inputs of their dtype."""
    by_name = {info.name: info for info in inputs}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise InputError(
            f"input_values names {unknown}, which are not graph inputs {sorted(by_name)}"
        )
    pinned = {}
    for name, value in values.items():
        array = np.array(value)
        elem = by_name[name].type.tensor_type.elem_type
        want = helper.tensor_dtype_to_np_dtype(elem) if elem else array.dtype
        if array.dtype != want:
            raise InputError(
                f"input {name!r}: expected dtype {np.dtype(want).name}, given {array.dtype.name}"
            )
        pinned[name] = _readonly(array)
    return pinned


def _pin_inputs(
    inputs: Sequence[onnx.ValueInfoProto], input_shapes: Mapping[str, Sequence[int]]
) -> list[onnx.ValueInfoProto]:
    """Copies of ``inputs`` with the dims given in ``input_shapes`` fixed."""
    by_name = {info.name: info for info in inputs}
    unknown = sorted(set(input_shapes) - set(by_name))
    if unknown:
        raise InputError(
            f"input_shapes names {unknown}, which are not graph inputs {sorted(by_name)}"
        )
    return [
        _pin_input(info, input_shapes[info.name]) if info.name in input_shapes else info
        for info in inputs
    ]


def _pin_input(info: onnx.ValueInfoProto, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    """``info`` with the dims of ``shape``: ints pin a dim, a str leaves a symbolic dim
    symbolic (under that name)."""
    if info.type.WhichOneof("value") != "tensor_type":
        raise InputError(f"input {info.name!r} is not a tensor; its shape cannot be pinned")
    declared = info.type.tensor_type.shape.dim
    has_shape = info.type.tensor_type.HasField("shape")
    if has_shape and len(declared) != len(shape):
        raise InputError(
            f"input {info.name!r} has rank {len(declared)}, input_shapes gives {list(shape)}"
        )
    for index, size in enumerate(shape):
        if isinstance(size, str) and not (has_shape and declared[index].HasField("dim_value")):
            continue
        if not isinstance(size, int | np.integer) or size < 0:
            raise InputError(
                f"input {info.name!r}: dim {index} must be a non-negative int, got {size!r}"
            )
        if (
            has_shape
            and declared[index].HasField("dim_value")
            and declared[index].dim_value != size
        ):
            raise InputError(
                f"input {info.name!r}: dim {index} is {declared[index].dim_value}, "
                f"input_shapes gives {size}"
            )
    elem_type = info.type.tensor_type.elem_type
    dims = [s if isinstance(s, str) else int(s) for s in shape]
    return helper.make_tensor_value_info(info.name, elem_type, dims)


def _name_nodes(nodes: Iterable[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Give every node a unique name: unnamed ones become ``{op_type}_{index}`` and later
    duplicates get a ``_1``, ``_2``… suffix. Renames in place (``nodes`` is our copy)."""
    nodes = list(nodes)
    wanted = [node.name or f"{node.op_type}_{i}" for i, node in enumerate(nodes)]
    taken = set(wanted)
    seen: set[str] = set()
    for node, name in zip(nodes, wanted, strict=True):
        unique = name
        if unique in seen:
            unique = next(f"{name}_{k}" for k in itertools.count(1) if f"{name}_{k}" not in taken)
            taken.add(unique)
        seen.add(unique)
        node.name = unique
    return nodes


def op_key(domain: str, op_type: str) -> str:
    """How an op is named in ``supported_ops``: ``Conv``, or ``com.microsoft.FusedConv``."""
    return op_type if domain in DEFAULT_DOMAINS else f"{domain}.{op_type}"


def _check_supported(nodes: Iterable[onnx.NodeProto], supported_ops: Collection[str]) -> None:
    supported = set(supported_ops)
    unsupported: dict[str, list[str]] = {}
    for node in nodes:
        key = op_key(node.domain, node.op_type)
        if key not in supported:
            unsupported.setdefault(key, []).append(node.name)
    if unsupported:
        raise UnsupportedOpError(unsupported)


def _build_graph(proto: onnx.ModelProto, input_names: Sequence[str], folded: Folded) -> Graph:
    """Convert the folded protobuf pieces into the immutable Graph."""
    opsets = opset_map(proto)
    nodes = tuple(_convert_node(node, opsets) for node in folded.nodes)
    output_names = [info.name for info in proto.graph.output]
    live = _live_names(input_names, output_names, folded.nodes)
    constants = {name: aligned(folded.constants[name]) for name in live if name in folded.constants}
    values = _values(live, constants, folded.types, _symbols())
    return Graph(
        name=proto.graph.name,
        inputs=tuple(_interface_value(values, name, "input") for name in input_names),
        outputs=tuple(_interface_value(values, name, "output") for name in output_names),
        nodes=nodes,
        values=MappingProxyType(values),
        constants=MappingProxyType(constants),
        opset=opsets[""],
    )


def _live_names(
    inputs: Sequence[str], outputs: Sequence[str], nodes: Sequence[onnx.NodeProto]
) -> list[str]:
    """Every tensor name the graph still uses, in a stable order (inputs, node inputs and
    outputs in node order, graph outputs), including outer-scope names read by subgraphs."""
    names = dict.fromkeys(inputs)
    for node in nodes:
        names.update(dict.fromkeys(_node_reads(node)))
        names.update(dict.fromkeys(node.output))
    names.update(dict.fromkeys(outputs))
    names.pop("", None)
    return list(names)


def _node_reads(node: onnx.NodeProto) -> Iterator[str]:
    """The node's inputs and every name its subgraphs read (a superset of outer reads)."""
    yield from node.input
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            for inner in graph.node:
                yield from _node_reads(inner)
            yield from (info.name for info in graph.output)


def _symbols() -> Iterator[str]:
    """Fresh names for dims nothing is known about: ?0, ?1, …"""
    return (f"?{i}" for i in itertools.count())


def _values(
    names: Sequence[str],
    constants: Mapping[str, np.ndarray],
    types: Mapping[str, onnx.TypeProto],
    symbols: Iterator[str],
) -> dict[str, Value]:
    """A Value for every name that is a constant or a tensor of known dtype and rank."""
    values = {}
    for name in names:
        if name in constants:
            array = constants[name]
            values[name] = Value(name, tuple(int(d) for d in array.shape), array.dtype.name)
            continue
        value = _typed_value(name, types.get(name), symbols)
        if value is not None:
            values[name] = value
    return values


def _typed_value(
    name: str, type_proto: onnx.TypeProto | None, symbols: Iterator[str]
) -> Value | None:
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    tensor = type_proto.tensor_type
    if not tensor.elem_type or not tensor.HasField("shape"):
        return None
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    return Value(name, tuple(_dim(d, symbols) for d in tensor.shape.dim), dtype)


def _dim(dim: onnx.TensorShapeProto.Dimension, symbols: Iterator[str]) -> Dim:
    if dim.HasField("dim_value"):
        return dim.dim_value
    if dim.HasField("dim_param") and dim.dim_param:
        return dim.dim_param
    return next(symbols)


def _interface_value(values: Mapping[str, Value], name: str, role: str) -> Value:
    if name not in values:
        raise ModelError(f"graph {role} {name!r} has no tensor type of known rank and dtype")
    return values[name]


def _convert_node(node: onnx.NodeProto, opsets: Mapping[str, int]) -> Node:
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    attrs = {attr.name: _attr_value(attr) for attr in node.attribute}
    return Node(
        name=node.name,
        op_type=node.op_type,
        inputs=tuple(node.input),
        outputs=tuple(node.output),
        attrs=MappingProxyType(attrs),
        domain=domain,
        opset=opsets.get(domain, 0),
    )


def _attr_value(attr: onnx.AttributeProto) -> AttrValue:
    """An attribute as Python: numbers, str, tuples, ndarrays; graphs stay GraphProto."""
    return _python_value(helper.get_attribute_value(attr))


def _python_value(value: object) -> AttrValue:
    if isinstance(value, bytes):
        return _decode(value)
    if isinstance(value, onnx.TensorProto):
        return _tensor_array(value, value.name or "attribute tensor")
    if isinstance(value, onnx.SparseTensorProto):
        return _readonly(densify(value))
    if isinstance(value, list):
        return tuple(_python_value(v) for v in value)
    return value


def _decode(value: bytes) -> str | bytes:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value
