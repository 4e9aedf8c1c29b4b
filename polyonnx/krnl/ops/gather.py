"""Data-dependent reads: Gather and GatherElements.

The output is written at affine positions; the data is read at indices loaded from the
index tensor (a LoadAt), with ONNX's negative indices wrapped (``i < 0 → i + n``) and
every index clamped into the buffer by code generation.
"""

from __future__ import annotations

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Iter, LoadAt, Statement
from polyonnx.krnl.lower import LowerContext, lowers


def wrapped(index: Expr, size: int) -> Expr:
    """``index`` as int64, with a negative index counted from the end of a dim of ``size``."""
    index = kb.cast(index, "int64")
    negative = kb.binary("lt", index, kb.const(0, "int64"), "bool")
    return kb.select(negative, kb.binary("add", index, kb.const(size, "int64")), index)


@lowers("Gather")
def lower_gather(ctx: LowerContext, node: Node) -> None:
    data, indices = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    rank, q = len(data.shape), len(indices.shape)
    axis = int(node.attr("axis", 0)) % rank
    shape = [*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :]]
    dims = kb.dims("d", len(shape))
    picked = kb.load(kb.access(indices.name, "S0", dims, dims[axis : axis + q]), indices.dtype)
    index = [
        *(Iter("int64", d) for d in dims[:axis]),
        wrapped(picked, data.shape[axis]),
        *(Iter("int64", d) for d in dims[axis + q :]),
    ]
    out = ctx.output(node.outputs[0], shape, data.dtype)
    body = LoadAt(data.dtype, data.name, tuple(index))
    write = kb.access(out.name, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, shape), write, body)])


@lowers("GatherElements")
def lower_gather_elements(ctx: LowerContext, node: Node) -> None:
    data, indices = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    rank = len(data.shape)
    axis = int(node.attr("axis", 0)) % rank
    dims = kb.dims("d", rank)
    picked = kb.load(kb.access(indices.name, "S0", dims, dims), indices.dtype)
    index = tuple(
        wrapped(picked, data.shape[r]) if r == axis else Iter("int64", d)
        for r, d in enumerate(dims)
    )
    out = ctx.output(node.outputs[0], indices.shape, data.dtype)
    body = LoadAt(data.dtype, data.name, index)
    write = kb.access(out.name, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, indices.shape), write, body)])
