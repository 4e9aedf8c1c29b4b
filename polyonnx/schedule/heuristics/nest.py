"""The default loop nest of one statement: the order of its loops and the SIMD loop,
chosen from the strides of its accesses, with contiguous dims coalesced.

The innermost loop is the dim along which the write is contiguous (or, for a reduction,
unchanged) and the most loads are contiguous; the reduction dims go just outside it, so
``C[i,j] += A[i,k] * B[k,j]`` runs ``i, k, j`` with ``j`` in SIMD lanes, and a row sum
runs its reduction dim in SIMD lanes with a vector accumulator.

Loops along which every access keeps moving contiguously are one loop: ``y[c][h][w] =
max(x[c][h][w], 0)`` over 64 x 7 x 7 runs ``for c / for (7*h + w)``, 49 SIMD iterations
in whole vectors instead of 7-wide rows that are mostly a scalar tail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from polyonnx.krnl.ir import REDUCE_OPS, Buffer, Statement, gathers, loads
from polyonnx.krnl.islutil import dim_names, extents, flat_stride, parse_set
from polyonnx.schedule.tree import LoopNest

MIN_VECTOR_EXTENT = 4
MAX_STRIDE = 4
"""The longest load step along a SIMD loop that emit/codegen.py reads as one load of the
span and a shuffle (stride s loads s vectors' worth for one; past it, one load per lane),
and the longest write step a statement takes SIMD along: its values are computed in
vectors and stored a lane at a time, which beat both scalar code and a shuffle with a
masked store (AVX2's masked stores are slow on Zen 3) in the Winograd output transform
(docs/measurements.md, 'Strided stores along a SIMD loop')."""


MAX_COALESCED = 4
"""The most dims of extent 2 or more merged into one loop. isl rebuilds each dim's value
from the merged loop's (its AST's call arguments, our access indices), and that inverse
grows with every merged dim (docs/measurements.md, 'Compile work bounded in rank and in
steps'). Four dims cover an NCHW tensor; dims of extent 1 cost nothing."""


def loop_nest(
    stmt: Statement, buffers: Mapping[str, Buffer], keep: str | None = None, coalesce: bool = True
) -> LoopNest:
    """The default nest of ``stmt``; the dim ``keep``, if given, stays a loop of its own;
    without ``coalesce``, every dim is a loop of its own."""
    names = dim_names(stmt)
    if not names:
        return LoopNest(())
    sizes = extents(stmt)
    scores = {pos: _score(stmt, buffers, pos) for pos in range(len(names))}
    candidates = [p for p, s in scores.items() if s is not None]
    if not candidates:
        return LoopNest(tuple(names))
    # a dim too short for SIMD gives way to a long one that also suits it: a 1x1 Conv
    # over a 1x1 image (a classifier) then sums along its channels in vectors instead of
    # one scalar chain per output
    inner = max(candidates, key=lambda p: (sizes[p] >= MIN_VECTOR_EXTENT and scores[p] > 0,
                                            scores[p], p))  # fmt: skip
    write_shape = buffers[stmt.write.buffer].shape
    reduced = [p for p in range(len(names)) if flat_stride(stmt.write, write_shape, p) == 0]
    outer = [p for p in range(len(names)) if p != inner and p not in reduced]
    order = [*outer, *(p for p in reduced if p != inner), inner]
    if stmt.reduce is None and not gathers(stmt.expr) and coalesce:
        return _coalesced(stmt, buffers, order, sizes, keep)
    vectorize = sizes[inner] >= MIN_VECTOR_EXTENT
    return LoopNest(tuple(names[p] for p in order), vectorize)


def _coalesced(stmt: Statement, buffers, order: list[int], sizes: list[int], keep) -> LoopNest:
    """``order`` with the innermost loops that every access walks contiguously merged
    into one (a box domain only), at most MAX_COALESCED of them longer than 1."""
    names = dim_names(stmt)
    accesses = [stmt.write, *(ld.access for ld in loads(stmt.expr))]
    strides = [
        [flat_stride(acc, buffers[acc.buffer].shape, p) for p in range(len(names))]
        for acc in accesses
    ]
    inner = order[-1]
    expr, span, merged = names[inner], sizes[inner], 1
    wide = int(sizes[inner] > 1)
    if _is_box(stmt):
        for p in reversed(order[:-1]):
            if names[p] == keep or not all(
                s[p] is not None and s[inner] is not None and s[p] == s[inner] * span
                for s in strides
            ):
                break
            if sizes[p] > 1 and wide == MAX_COALESCED:
                break
            expr = f"{span}*{names[p]} + {expr}"
            span *= sizes[p]
            merged += 1
            wide += int(sizes[p] > 1)
    loops = [names[p] for p in order[: len(order) - merged]] + [expr]
    return LoopNest(tuple(loops), span >= MIN_VECTOR_EXTENT)


def _is_box(stmt: Statement) -> bool:
    return parse_set(stmt.domain).is_box()


def _score(stmt: Statement, buffers: Mapping[str, Buffer], pos: int) -> int | None:
    """How well SIMD along dim ``pos`` suits the statement; None when it cannot work."""
    write = flat_stride(stmt.write, buffers[stmt.write.buffer].shape, pos)
    if write == 0 and stmt.reduce not in REDUCE_OPS:
        return None
    if write not in (0, 1) and not (write is not None and 1 < write <= MAX_STRIDE):
        return None
    score = {0: 0, 1: 2}.get(write, 1)  # a short stride: stored a lane at a time
    for load in loads(stmt.expr):
        stride = flat_stride(load.access, buffers[load.access.buffer].shape, pos)
        score += {1: 1, 0: 0}.get(stride, -1)
    return score


def loop_name(expr: str, statement: str | None = None) -> str:
    """A loop's name from its expression: ``7*h + w`` -> ``h_w``; with a statement,
    ``h_w_S2`` (statements of one kernel then have loops of their own: marks go by
    loop name)."""
    base = "_".join(re.findall(r"[A-Za-z_]\w*", expr))
    return f"{base}_{statement}" if statement else base
