"""Contractions: MatMul (numpy semantics: batched, broadcast batch dims, 1-D operands)
and Gemm (alpha, beta, transA, transB, C broadcast).

Each is an init statement followed by a sum reduction over ``k``::

    S0: Y[b.., i, j] = 0                       (Gemm: beta * C[..])
    S1: Y[b.., i, j] += A[b.., i, k] * B[b.., k, j]

A one-row MatMul with a big B sums parts of K apart, then adds them (SPLIT_K_BYTES);
each part reads S slices of its K side by side (SIDE_BY_SIDE; s: a slice's length)::

    S0: P[h, j] = 0
    S1: P[h, j] += A[s*(S*h + t) + k] * B[s*(S*h + t) + k, j]     (loops h, k, t, j)
    .sum kernel: Y[j] = P[0, j] + P[1, j]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from polyonnx.aligned import ALIGN
from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Expr, Statement
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.conv import domain


@lowers("MatMul")
def lower_matmul(ctx: LowerContext, node: Node) -> None:
    a, b = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    if not a.shape or not b.shape:
        raise LoweringError(f"MatMul node {node.name!r}: operands must have rank >= 1")
    a_shape = (1, *a.shape) if len(a.shape) == 1 else a.shape
    b_shape = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    m, k = a_shape[-2:]
    k2, n = b_shape[-2:]
    if k != k2:
        raise LoweringError(f"MatMul node {node.name!r}: inner dims differ, {a.shape} @ {b.shape}")
    batch = kb.broadcast_shape(a_shape[:-2], b_shape[:-2])
    bdims = kb.dims("b", len(batch))
    # the loop dims: a 1-D operand contributes no i (or j) loop
    keep_i, keep_j = len(a.shape) > 1, len(b.shape) > 1
    out_dims = [*bdims, *(["i"] if keep_i else []), *(["j"] if keep_j else [])]
    out_shape = [*batch, *([m] if keep_i else []), *([n] if keep_j else [])]
    i, j = ("i" if keep_i else "0"), ("j" if keep_j else "0")
    a_lead = kb.broadcast_index(bdims, a_shape[:-2])
    b_lead = kb.broadcast_index(bdims, b_shape[:-2])
    a_index = [*a_lead, i, "k"] if len(a.shape) > 1 else ["k"]
    b_index = [*b_lead, "k", j] if len(b.shape) > 1 else ["k"]
    full = [*out_dims, "k"]
    product = kb.binary(
        "mul",
        kb.load(kb.access(a.name, "S1", full, a_index), a.dtype),
        kb.load(kb.access(b.name, "S1", full, b_index), b.dtype),
    )
    out = ctx.output(node.outputs[0], out_shape, a.dtype)
    if not batch and m == 1 and _split_k(k, n, a.dtype):
        _lower_split_k(ctx, node, (a, a_index), (b, b_index), out.name, out_dims, out_shape, k)
        return
    init = kb.const(0, a.dtype)
    ctx.kernel(node, _contraction(ctx, out.name, out_dims, out_shape, k, init, product))


SPLIT_K = 2
SPLIT_K_BYTES = 8 << 20
"""A one-row MatMul (a matrix-vector product) whose B is at least this big, and whose K
SPLIT_K divides, sums each of SPLIT_K parts of K into its own row of a temp, then adds the
rows: the parts run on threads, each reading its rows of B start to end, where column
chunks of every row (schedule/heuristics/blocking.py's GEMV_CHUNKS) read each row in pieces, one per
pass. B that big comes from memory either way. Measured on a Zen 5 (docs/measurements.md,
'Matrix-vector products split along K')."""
INPUT_OFFSET = 16
"""Bytes past a 64-byte line at which a big input B of a one-row MatMul is taken to start
until a run says otherwise (the session compiles per start it meets): numpy's big arrays
start there (glibc's mmap'd chunks start 16 bytes into a page). B's columns are then read
shifted so that its rows' vectors, but a row's first and last, lie on whole cache lines;
any start is read correctly, only slower (docs/measurements.md, 'Where a one-row
MatMul's B is taken to start')."""
SIDE_BY_SIDE = 8
"""Slices each part of K reads side by side, row k of each at a time (or the largest power
of two below it that divides the part, 1 at least); at most schedule/heuristics/blocking.py's
ROW_BLOCK, which reads rows in a row otherwise: one core reads memory faster along a few
streams far apart than along rows in a row (docs/measurements.md, 'Slices read side by
side')."""


def _split_k(k: int, n: int, dtype: str) -> bool:
    return dtype == "float32" and k % SPLIT_K == 0 and 4 * k * n >= SPLIT_K_BYTES


def _lower_split_k(ctx, node, a_op, b_op, out: str, dims, shape, k: int) -> None:
    """``part[h, ..] = sum over k of part h`` (its slices side by side), then ``out =
    part[0] + part[1] ..``."""
    (a, a_index), (b, b_index) = a_op, b_op
    side = next(SIDE_BY_SIDE >> i for i in range(SIDE_BY_SIDE.bit_length())
                if k % (SPLIT_K * (SIDE_BY_SIDE >> i)) == 0)  # fmt: skip
    slice_k = k // (SPLIT_K * side)
    part_shape = (SPLIT_K, *shape)
    part = ctx.temp(out + ".part", part_shape, a.dtype).name
    rows = ["h", *dims]
    reduce = [("k", slice_k), ("t", side)] if side > 1 else [("k", slice_k)]
    at = f"{slice_k}*({side}*h + t) + k" if side > 1 else f"{slice_k}*h + k"
    full = [*rows, *(name for name, _ in reduce)]

    def sliced(index: list[str]) -> list[str]:
        return [at if x == "k" else x for x in index]

    shift = 0
    if b.name in {v.name for v in ctx.graph.inputs}:
        offset, size = ctx.input_offset(b.name, INPUT_OFFSET), np.dtype(b.dtype).itemsize
        shift = offset % ALIGN // size if offset % size == 0 else 0
    column = dims[-1]

    def shifted(index: list[str]) -> list[str]:
        return [f"{x} - {shift}" if x == column else x for x in index]

    product = kb.binary(
        "mul",
        kb.load(kb.access(a.name, "S1", full, sliced(a_index)), a.dtype),
        kb.load(kb.access(b.name, "S1", full, shifted(sliced(b_index))), b.dtype),
    )
    zero = kb.const(0, a.dtype)
    init, update = _contraction(ctx, part, rows, part_shape, reduce, zero, product)
    if shift:  # columns shift..n + shift - 1 stand for 0..n - 1
        names = [*rows, *(name for name, _ in reduce)]
        sizes = [*part_shape[:-1], part_shape[-1] + shift, *(extent for _, extent in reduce)]
        where = domain("S1", names, sizes, [f"{column} >= {shift}"])
        write = kb.access(part, "S1", names, shifted(rows))
        update = dataclasses.replace(update, domain=where, write=write)
    ctx.kernel(node, [init, update])
    total: Expr = kb.load(kb.access(part, "S0", dims, ["0", *dims]), a.dtype)
    for h in range(1, SPLIT_K):
        total = kb.binary(
            "add", total, kb.load(kb.access(part, "S0", dims, [str(h), *dims]), a.dtype)
        )
    add = Statement("S0", kb.box("S0", dims, shape), kb.access(out, "S0", dims, dims), total)
    ctx.kernel(node, [add], ".sum", "Add")


@lowers("Gemm")
def lower_gemm(ctx: LowerContext, node: Node) -> None:
    a = ctx.buffer(node.inputs[0])
    b, trans_b = _b_operand(ctx, node, a)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise LoweringError(
            f"Gemm node {node.name!r}: A and B must be 2-D, got {a.shape}, {b.shape}"
        )
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    trans_a = int(node.attr("transA", 0))
    m, k = a.shape[::-1] if trans_a else a.shape
    k2, n = b.shape[::-1] if trans_b else b.shape
    if k != k2:
        raise LoweringError(f"Gemm node {node.name!r}: inner dims differ, {a.shape}, {b.shape}")
    full = ["i", "j", "k"]
    a_load = kb.load(kb.access(a.name, "S1", full, ["k", "i"] if trans_a else ["i", "k"]), a.dtype)
    b_load = kb.load(kb.access(b.name, "S1", full, ["j", "k"] if trans_b else ["k", "j"]), b.dtype)
    if alpha != 1.0:
        a_load = kb.binary("mul", kb.const(alpha, a.dtype), a_load)
    init: Expr = kb.const(0, a.dtype)
    if node.input(2) and beta != 0.0:
        init = ctx.operand(node.inputs[2], "S0", ["i", "j"])
        kb.broadcast_shape(ctx.buffer(node.inputs[2]).shape, (m, n))  # validates
        if beta != 1.0:
            init = kb.binary("mul", kb.const(beta, a.dtype), init)
    out = ctx.output(node.outputs[0], (m, n), a.dtype)
    product = kb.binary("mul", a_load, b_load)
    ctx.kernel(node, _contraction(ctx, out.name, ["i", "j"], (m, n), k, init, product))


TRANSPOSED_ROWS = 3
"""Rows of A from which Gemm transposes a constant B for transB. One or two rows run as
dot products, which read the weights' rows as they are (docs/measurements.md, 'Gemm
transposes a constant B from 3 rows')."""


def _b_operand(ctx: LowerContext, node: Node, a: Buffer) -> tuple[Buffer, bool]:
    """Gemm's B, and whether it is still read transposed.

    With transB a constant B (a layer's weights, [out, in]) is transposed once here, so
    the GEMM reads it contiguous along its columns (in place, or packed by plain copies)
    instead of gathering a column of the weights for every row of its packed panel on
    every call; onnxruntime prepacks constant weights the same way (docs/measurements.md,
    'Gemm's constant B transposed once')."""
    name, trans_b = node.inputs[1], bool(node.attr("transB", 0))
    weights = ctx.constant(name) if trans_b and len(a.shape) == 2 else None
    if (
        weights is None
        or weights.ndim != 2
        or (a.shape[1] if node.attr("transA", 0) else a.shape[0]) < TRANSPOSED_ROWS
    ):
        return ctx.buffer(name), trans_b
    return ctx.table(f"{name}_transposed", np.ascontiguousarray(weights.T)), False


def _contraction(
    ctx: LowerContext, out: str, dims: list[str], shape, k, init: Expr, product: Expr
) -> list[Statement]:
    """Init, then the sum over k (an extent, or reduction dims as (name, extent) pairs,
    outermost first). float16 sums run in a float32 temp rounded once at the end, as numpy
    does: an fp16 accumulator loses about log2(k) bits."""
    reduce = [("k", k)] if isinstance(k, int) else list(k)
    full = [*dims, *(name for name, _ in reduce)]
    half = product.dtype == "float16"
    acc = ctx.temp(out + ".acc", shape, "float32").name if half else out
    if half:
        init = kb.cast(init, "float32")
        product = kb.binary("mul", *(kb.cast(x, "float32") for x in (product.a, product.b)))
    init_stmt = Statement("S0", kb.box("S0", dims, shape), kb.access(acc, "S0", dims, dims), init)
    update = Statement(
        "S1",
        kb.box("S1", full, [*shape, *(extent for _, extent in reduce)]),
        kb.access(acc, "S1", full, dims),
        product,
        "add",
    )
    if not half:
        return [init_stmt, update]
    rounded = kb.cast(kb.load(kb.access(acc, "S2", dims, dims), "float32"), "float16")
    final = Statement("S2", kb.box("S2", dims, shape), kb.access(out, "S2", dims, dims), rounded)
    return [init_stmt, update, final]
