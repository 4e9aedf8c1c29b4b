"""Scatters: ScatterElements, ScatterND and the old Scatter (opsets 9-10).

A scatter writes at data-dependent positions, which the IR cannot express: a write is an
affine access. So each is formulated as a gather: for every output element ``p``, look
through the updates for those whose index equals ``p``.

Without a reduction the last such update (in update order) wins, as in the reference,
which applies updates one after another. Its position is found by a max-reduction into
an int64 temp, and the output reads it back with a LoadAt::

    S0: last[p] = -1
    S1: last[p] = max(last[p], index(u) == p ? u : -1)          over p, u
    S2: out[p]  = last[p] >= 0 ? updates[last[p]] : data[p]

With a reduction (add, mul, max, min) every matching update is folded in, in update
order, by a reduction statement over the updates::

    S0: out[p] = data[p]
    S1: out[p] = out[p] <op> (index(u) == p ? updates[u] : identity)   over p, u

This costs O(|out| · |updates|) comparisons, where a real scatter costs O(|updates|):
correct for any index pattern (duplicates, negative indices), but slow for large
tensors. Two things keep it smaller than that bound: ScatterElements only searches the
indexed axis (an update can only land on the output elements that share its other
coordinates), and ScatterND searches once per indexed prefix ``data[i_0, .., i_k-1]``,
not per element of the slice it writes. An index outside ``[-n, n)`` is a run-time
error (a Checked, where the search reads it: the run raises RunError naming the node,
the index and the range); it never matches, so memory stays safe without the check.
"""

from __future__ import annotations

import math
from functools import reduce

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Expr, Iter, LoadAt, Statement, reduce_identity
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.gather import checked_index, wrapped

REDUCTIONS = {"none": None, "add": "add", "mul": "mul", "max": "max", "min": "min"}


def _reduction(node: Node, where: str) -> str | None:
    value = node.attr("reduction", "none")
    text = value.decode() if isinstance(value, bytes) else str(value)
    if text not in REDUCTIONS:
        raise LoweringError(f"{where}: unknown reduction {text!r}")
    return REDUCTIONS[text]


def _operands(ctx: LowerContext, node: Node) -> tuple[Buffer, Buffer, Buffer]:
    data, indices, updates = (ctx.buffer(node.inputs[i]) for i in range(3))
    where = f"{node.op_type} node {node.name!r}"
    if indices.dtype not in ("int32", "int64"):
        raise LoweringError(f"{where}: indices must be int32 or int64, not {indices.dtype}")
    if updates.dtype != data.dtype:
        raise LoweringError(f"{where}: updates are {updates.dtype} but data is {data.dtype}")
    return data, indices, updates


def _copy(name: str, out: str, src: str, dtype: str, shape) -> Statement:
    dims = kb.dims("d", len(shape))
    body = kb.load(kb.access(src, name, dims, dims), dtype)
    return Statement(name, kb.box(name, dims, shape), kb.access(out, name, dims, dims), body)


def _i64(value: int) -> Expr:
    return kb.const(value, "int64")


# ---- ScatterElements and Scatter ------------------------------------------------------


@lowers("ScatterElements", "Scatter")
def lower_scatter_elements(ctx: LowerContext, node: Node) -> None:
    """Along ``axis``: ``out[.., indices[.., j, ..], ..] = updates[.., j, ..]``."""
    where = f"{node.op_type} node {node.name!r}"
    data, indices, updates = _operands(ctx, node)
    rank = len(data.shape)
    if len(indices.shape) != rank or indices.shape != updates.shape:
        raise LoweringError(
            f"{where}: data {data.shape}, indices {indices.shape} and updates "
            f"{updates.shape} must have the same rank, and indices the shape of updates"
        )
    if rank == 0:
        raise LoweringError(f"{where}: data must have rank >= 1")
    axis = kb.normalize_axis(int(node.attr("axis", 0)), rank, where)
    op = _reduction(node, where) if node.op_type == "ScatterElements" else None
    out = ctx.output(node.outputs[0], data.shape, data.dtype).name
    if not data.size:
        return
    # the output elements an update can reach: other coordinates within the updates
    reach = [
        n if r == axis else min(n, m)
        for r, (n, m) in enumerate(zip(data.shape, indices.shape, strict=True))
    ]
    if not indices.size or not math.prod(reach):
        ctx.kernel(node, [_copy("S0", out, data.name, data.dtype, data.shape)])
        return
    dims = kb.dims("d", rank)
    full = [*dims, "j"]
    at_j = [("j" if r == axis else d) for r, d in enumerate(dims)]

    def match(stmt: str) -> Expr:
        index = kb.load(kb.access(indices.name, stmt, full, at_j), indices.dtype)
        index = checked_index(node, index, data.shape[axis], axis, node.inputs[0])
        return kb.binary("eq", wrapped(index, data.shape[axis]), Iter("int64", dims[axis]), "bool")

    domain = kb.box("S1", full, [*reach, indices.shape[axis]])
    if op is not None:
        update = kb.load(kb.access(updates.name, "S1", full, at_j), data.dtype)
        body = kb.select(match("S1"), update, kb.const(reduce_identity(op, data.dtype), data.dtype))
        write = kb.access(out, "S1", full, dims)
        statements = [_copy("S0", out, data.name, data.dtype, data.shape)]
        statements.append(Statement("S1", domain, write, body, op))
        ctx.kernel(node, statements)
        return

    last = ctx.temp(f"{out}.last", reach, "int64").name
    found = kb.load(kb.access(last, "S3", dims, dims), "int64")
    picked = tuple(found if r == axis else Iter("int64", d) for r, d in enumerate(dims))
    value = LoadAt(data.dtype, updates.name, picked)
    hit = kb.binary("ge", found, _i64(0), "bool")
    keep = kb.load(kb.access(data.name, "S3", dims, dims), data.dtype)
    statements = [
        Statement("S0", kb.box("S0", dims, reach), kb.access(last, "S0", dims, dims), _i64(-1)),
        Statement(
            "S1",
            domain,
            kb.access(last, "S1", full, dims),
            kb.select(match("S1"), Iter("int64", "j"), _i64(-1)),
            "max",
        ),
        _copy("S2", out, data.name, data.dtype, data.shape),
        Statement(
            "S3",
            kb.box("S3", dims, reach),
            kb.access(out, "S3", dims, dims),
            kb.select(hit, value, keep),
        ),
    ]
    ctx.kernel(node, statements)


# ---- ScatterND ------------------------------------------------------------------------


@lowers("ScatterND")
def lower_scatter_nd(ctx: LowerContext, node: Node) -> None:
    """``out[indices[u]] = updates[u]`` for every index tuple ``u`` (a prefix of the data's
    dims; the update is the slice of the remaining dims)."""
    where = f"ScatterND node {node.name!r}"
    data, indices, updates = _operands(ctx, node)
    rank = len(data.shape)
    if not indices.shape:
        raise LoweringError(f"{where}: indices must have rank >= 1")
    depth = indices.shape[-1]
    tuples = indices.shape[:-1]
    if depth > rank or updates.shape != (*tuples, *data.shape[depth:]):
        raise LoweringError(
            f"{where}: indices {indices.shape} and updates {updates.shape} do not fit data "
            f"{data.shape} (updates must be indices.shape[:-1] + data.shape[indices.shape[-1]:])"
        )
    op = _reduction(node, where)
    out = ctx.output(node.outputs[0], data.shape, data.dtype).name
    if not data.size:
        return
    if not math.prod(tuples):
        ctx.kernel(node, [_copy("S0", out, data.name, data.dtype, data.shape)])
        return
    dims = kb.dims("d", rank)
    prefix = dims[:depth]
    u = kb.dims("u", len(tuples))

    def index(stmt: str, domain_dims: list[str], m: int) -> Expr:
        picked = kb.load(kb.access(indices.name, stmt, domain_dims, [*u, str(m)]), indices.dtype)
        return wrapped(checked_index(node, picked, data.shape[m], m, node.inputs[0]), data.shape[m])

    def match(stmt: str, domain_dims: list[str]) -> Expr:
        hits = [
            kb.binary("eq", index(stmt, domain_dims, m), Iter("int64", prefix[m]), "bool")
            for m in range(depth)
        ]
        if not hits:
            return kb.const(True, "bool")
        return reduce(lambda a, b: kb.binary("and", a, b), hits)

    if op is not None:
        full = [*dims, *u]
        update = kb.load(kb.access(updates.name, "S1", full, [*u, *dims[depth:]]), data.dtype)
        identity = kb.const(reduce_identity(op, data.dtype), data.dtype)
        body = kb.select(match("S1", full), update, identity)
        domain = kb.box("S1", full, [*data.shape, *tuples])
        statements = [_copy("S0", out, data.name, data.dtype, data.shape)]
        statements.append(Statement("S1", domain, kb.access(out, "S1", full, dims), body, op))
        ctx.kernel(node, statements)
        return

    heads = data.shape[:depth]
    last = ctx.temp(f"{out}.last", heads, "int64").name
    search = [*prefix, *u]
    strides = [math.prod(tuples[q + 1 :]) for q in range(len(tuples))]
    position = reduce(
        lambda a, b: kb.binary("add", a, b),
        [kb.binary("mul", Iter("int64", d), _i64(s)) for d, s in zip(u, strides, strict=True)],
        _i64(0),
    )
    found = kb.load(kb.access(last, "S2", dims, prefix), "int64")
    picked = [
        kb.binary("mod", kb.binary("div", found, _i64(s)), _i64(n))
        for s, n in zip(strides, tuples, strict=True)
    ]
    value = LoadAt(data.dtype, updates.name, (*picked, *(Iter("int64", d) for d in dims[depth:])))
    hit = kb.binary("ge", found, _i64(0), "bool")
    keep = kb.load(kb.access(data.name, "S2", dims, dims), data.dtype)
    statements = [
        Statement(
            "S0", kb.box("S0", prefix, heads), kb.access(last, "S0", prefix, prefix), _i64(-1)
        ),
        Statement(
            "S1",
            kb.box("S1", search, [*heads, *tuples]),
            kb.access(last, "S1", search, prefix),
            kb.select(match("S1", search), position, _i64(-1)),
            "max",
        ),
        Statement(
            "S2",
            kb.box("S2", dims, data.shape),
            kb.access(out, "S2", dims, dims),
            kb.select(hit, value, keep),
        ),
    ]
    ctx.kernel(node, statements)
