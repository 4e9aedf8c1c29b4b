"""Building blocks of the fuzz generator: small models built with onnx.helper, the real
models of the repository, byte-level damage and a protobuf wire walker (to find varints)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]

REAL_MODELS = (
    "examples/mm_bias_relu.onnx",
    "examples/mlp.onnx",
    "tests/data/torch/mlp_torchscript.onnx",
    "tests/data/torch/mlp_dynamo.onnx",
    "tests/data/torch/resnet_torchscript.onnx",
    "tests/data/torch/lenet_torchscript.onnx",
)
"""Small real models whose bytes family 1 damages (resnet_torchscript has external data)."""

F32 = TensorProto.FLOAT
I32 = TensorProto.INT32
I64 = TensorProto.INT64


def vi(name: str, elem: int | None, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    """A graph input or output (an output's missing elem type or shape: see model)."""
    return helper.make_tensor_value_info(name, elem or TensorProto.UNDEFINED, shape)


def const(name: str, array: np.ndarray) -> onnx.TensorProto:
    """An initializer holding ``array``."""
    return onnx.numpy_helper.from_array(np.asarray(array), name)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    inits: Sequence[onnx.TensorProto] = (),
    opset: int = 17,
    **graph_fields,
) -> onnx.ModelProto:
    """A model of one graph at ``opset`` (ir_version 10: onnxruntime reads at most 13).
    Outputs declared without a shape get the one shape inference gives (the checker wants
    one), so that a case reaches polyonnx's own checks instead of the checker's."""
    graph = helper.make_graph(list(nodes), "fuzz", list(inputs), list(outputs), list(inits))
    for key, value in graph_fields.items():
        getattr(graph, key).extend(value)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    _declare_output_shapes(proto)
    return proto


def _declare_output_shapes(proto: onnx.ModelProto) -> None:
    def incomplete(t: onnx.TypeProto.Tensor) -> bool:
        return not t.HasField("shape") or t.elem_type == TensorProto.UNDEFINED

    missing = [o for o in proto.graph.output if incomplete(o.type.tensor_type)]
    if not missing:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
        known = {v.name: v.type.tensor_type for v in [*inferred.value_info, *inferred.output]}
    except Exception:  # invalid on purpose: guess below
        known = {}
    rank = len(proto.graph.input[0].type.tensor_type.shape.dim) if proto.graph.input else 1
    rank = max(rank, 1)
    for out in missing:
        declared, found = out.type.tensor_type, known.get(out.name)
        if declared.elem_type == TensorProto.UNDEFINED:
            declared.elem_type = found.elem_type if found and found.elem_type else F32
        if declared.HasField("shape"):
            continue
        if found is not None and found.HasField("shape"):
            declared.shape.CopyFrom(found.shape)
        else:
            for n in range(rank):
                declared.shape.dim.add().dim_param = f"{out.name}_{n}"


def unary(op: str, shape: Sequence[int], elem: int = F32, **attrs) -> onnx.ModelProto:
    """``y = op(x)`` on one input of ``shape``."""
    node = helper.make_node(op, ["x"], ["y"], name=op.lower(), **attrs)
    return model([node], [vi("x", elem, shape)], [vi("y", elem, None)])


def binary(op: str, a: Sequence[int], b: Sequence[int], elem: int = F32) -> onnx.ModelProto:
    """``y = op(a, b)`` on two inputs."""
    node = helper.make_node(op, ["a", "b"], ["y"], name=op.lower())
    return model([node], [vi("a", elem, a), vi("b", elem, b)], [vi("y", elem, None)])


def mm_bias_relu(m: int = 8, k: int = 16, n: int = 12) -> onnx.ModelProto:
    """A small MatMul + Add + Relu, the shape of examples/mm_bias_relu.onnx."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
        helper.make_node("Add", ["t", "b"], ["u"], name="bias"),
        helper.make_node("Relu", ["u"], ["y"], name="relu"),
    ]
    inits = [
        const("w", rng.standard_normal((k, n)).astype(np.float32)),
        const("b", rng.standard_normal(n).astype(np.float32)),
    ]
    return model(nodes, [vi("x", F32, [m, k])], [vi("y", F32, [m, n])], inits)


def feeds_for(proto: onnx.ModelProto, rng: np.random.Generator, sym: int = 2) -> dict:
    """Random inputs for every graph input that is not an initializer (symbolic dims: ``sym``)."""
    inits = {t.name for t in proto.graph.initializer}
    feeds = {}
    for value in proto.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sym for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[value.name] = random_array(rng, shape, dtype)
    return feeds


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype) -> np.ndarray:
    """Values of ``dtype`` spread enough to show a wrong result."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 5, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


# ---- byte-level damage -----------------------------------------------------------------


def varint(value: int) -> bytes:
    """The protobuf base-128 encoding of a non-negative ``value`` (up to 10 bytes)."""
    out = bytearray()
    value &= (1 << 70) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            return value, pos


def varints(data: bytes, start: int = 0, end: int | None = None, depth: int = 0) -> list:
    """(offset, length) of the varints of a protobuf message: tags, varint values and the
    lengths of length-delimited fields, recursing into fields that parse as messages."""
    end = len(data) if end is None else end
    found: list[tuple[int, int]] = []
    pos = start
    try:
        while pos < end:
            tag, after = _read_varint(data, pos)
            found.append((pos, after - pos))
            pos, wire = after, tag & 7
            if wire == 0:
                _, after = _read_varint(data, pos)
                found.append((pos, after - pos))
                pos = after
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                size, after = _read_varint(data, pos)
                found.append((pos, after - pos))
                pos = after
                if depth < 6 and size < 1 << 16:
                    found += varints(data, pos, min(pos + size, end), depth + 1)
                pos += size
            else:
                break
    except ValueError:
        pass
    return found


VARINT_VALUES = (0, 1, 127, 128, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63 - 1, 2**64 - 1)


def damage(data: bytes, kind: str, rng: random.Random) -> tuple[bytes, str]:
    """``data`` damaged by ``kind``, and a note of where."""
    buf = bytearray(data)
    n = len(buf)
    if kind == "truncate":
        cut = rng.choice([rng.randrange(n), n - 1, n // 2, rng.randrange(min(64, n))])
        return bytes(buf[:cut]), f"truncated to {cut} of {n} bytes"
    if kind == "bitflip":
        count = rng.choice([1, 1, 2, 8, 64])
        spots = [rng.randrange(n) for _ in range(count)]
        for spot in spots:
            buf[spot] ^= 1 << rng.randrange(8)
        return bytes(buf), f"{count} bit flip(s) at {spots[:4]}"
    if kind == "insert":
        spot = rng.randrange(n)
        junk = bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 17])))
        return bytes(buf[:spot] + junk + buf[spot:]), f"{len(junk)} byte(s) inserted at {spot}"
    if kind == "delete":
        spot = rng.randrange(n)
        size = rng.choice([1, 2, 9, 100])
        return bytes(buf[:spot] + buf[spot + size :]), f"{size} byte(s) deleted at {spot}"
    if kind == "varint":
        return _overwrite_varint(data, rng)
    raise ValueError(kind)


def _overwrite_varint(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    spots = varints(data)
    offset, length = rng.choice(spots)
    old, _ = _read_varint(data, offset)
    value = rng.choice([*VARINT_VALUES, old + 1, max(old - 1, 0), old * 2 + 1])
    new = varint(value)
    if rng.random() < 0.5 and len(new) > length:  # keep the length: the rest stays aligned
        new = varint(value & ((1 << (7 * length)) - 1))
    return (
        data[:offset] + new + data[offset + length :],
        f"varint at {offset} ({old}) set to {int.from_bytes(new[:8], 'little')}",
    )


def replace_name(data: bytes, name: str, new: bytes) -> bytes:
    """``data`` with every occurrence of the UTF-8 ``name`` replaced by ``new`` bytes of
    the same length (how invalid UTF-8 gets into a protobuf string field)."""
    old = name.encode()
    assert len(old) == len(new) and old in data
    return data.replace(old, new)
