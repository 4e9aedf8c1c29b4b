"""Data-dependent reads: Gather, GatherElements and GatherND.

The output is written at affine positions; the data is read at indices loaded from the
index tensor (a LoadAt), with ONNX's negative indices wrapped (``i < 0 → i + n``). An
index outside ``[-n, n)`` is a run-time error (a Checked: the run raises RunError naming
the node, the index and the range); code generation still clamps it into the buffer.
"""

from __future__ import annotations

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import CheckSite, Expr, Extent, Iter, LoadAt, Statement, in_range, within
from polyonnx.krnl.lower import LowerContext, lowers


def checked_index(node: Node, index: Expr, size: int, axis: int, tensor: str) -> Expr:
    """``index`` (from a user's index tensor), checked to lie in ``[-size, size)``: the
    indices axis ``axis`` of ``tensor`` takes, negative ones counted from the end."""
    message = f"index {{value}} is out of range [{-size}, {size - 1}] on axis {axis} of {tensor!r}"
    return in_range(index, -size, size - 1, CheckSite(node.name, node.op_type, message))


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
    n = data.shape[axis]
    dims = kb.dims("d", len(shape))
    picked = kb.load(kb.access(indices.name, "S0", dims, dims[axis : axis + q]), indices.dtype)
    index = [
        *(Iter("int64", d) for d in dims[:axis]),
        wrapped(checked_index(node, picked, data.shape[axis], axis, node.inputs[0]), n),
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
    picked = checked_index(node, picked, data.shape[axis], axis, node.inputs[0])
    index = tuple(
        wrapped(picked, data.shape[r]) if r == axis else Iter("int64", d)
        for r, d in enumerate(dims)
    )
    out = ctx.output(node.outputs[0], indices.shape, data.dtype)
    body = LoadAt(data.dtype, data.name, index)
    write = kb.access(out.name, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, indices.shape), write, body)])


@lowers("GatherND")
def lower_gather_nd(ctx: LowerContext, node: Node) -> None:
    """``out[i..., j...] = data[i[:b]..., idx[i..., 0], ..., idx[i..., k-1], j...]``: the
    first ``batch_dims`` (b) index dims are shared with data, and each of the k indices
    read from the index tensor's last dim is checked against its data dim and wrapped.
    The dims are Extents: a transformers padding mask gathers from data of symbolic
    shape, so the same expression must serve every size (krnl/params.py)."""
    data, indices = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    b = int(node.attr("batch_dims", 0))
    q, k = len(indices.shape), indices.shape[-1]
    shape = [*indices.shape[:-1], *data.shape[b + k :]]
    dims = kb.dims("d", len(shape))
    lead = dims[: q - 1]
    picked = []
    for c in range(k):
        load = kb.load(kb.access(indices.name, "S0", dims, [*lead, str(c)]), indices.dtype)
        size = Extent("int64", data.name, b + c)
        message = f"index {{value}} is out of range of axis {b + c} of {node.inputs[0]!r}"
        checked = within(load, size, CheckSite(node.name, node.op_type, message))
        index = kb.cast(checked, "int64")
        negative = kb.binary("lt", index, kb.const(0, "int64"), "bool")
        picked.append(kb.select(negative, kb.binary("add", index, size), index))
    index = (
        *(Iter("int64", d) for d in dims[:b]),
        *picked,
        *(Iter("int64", d) for d in dims[q - 1 :]),
    )
    out = ctx.output(node.outputs[0], shape, data.dtype)
    body = LoadAt(data.dtype, data.name, index)
    write = kb.access(out.name, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, shape), write, body)])
