"""Row fusion: the statements of a row-wise kernel (Softmax, LayerNorm, normalisations:
a reduction per row, then element-wise passes using it) share one loop over the rows.

    for d0:                                    for d0:
      for r: m[d0] = max(m[d0], x[d0][r])        for r: m[d0] = max(...)
    for d0:                          ==>         for r: y[d0][r] = exp(x[d0][r] - m[d0])
      for r: y[d0][r] = exp(...)                 for r: s[d0] += y[d0][r]
    ...                                          for r: y[d0][r] *= 1 / s[d0]

Each row is then read from memory once and stays in L1 for the following passes, instead
of every pass streaming the whole tensor. Inside the row loop each statement keeps its
default nest (coalesced, innermost in SIMD). The fusion is checked against the kernel's
dependences like any schedule.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel
from polyonnx.krnl.islutil import dim_names, extents
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.heuristics.nest import loop_name, loop_nest
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.state import Nest, State, Var
from polyonnx.schedule.tree import KernelSchedule, LoopNest

MIN_ROWS = 2


def row_fused_schedule(
    kernel: Kernel,
    buffers: Mapping[str, Buffer],
    reducing: bool = True,
    max_row: int | None = None,
    orders: Mapping[str, Sequence[str]] | None = None,
) -> KernelSchedule | None:
    """All statements under one loop over their common first dim, or None when they do
    not share one, none of them reduces (unless ``reducing`` is False: a pool through a
    padded copy of each plane chains its passes through temps instead), a statement has
    more than ``max_row`` points a row, or the fusion would break a dependence. Inside
    the row a statement runs its default nest, or the dims ``orders`` gives it with the
    last in SIMD lanes (a pool's window around its output rows)."""
    orders = orders or {}
    stmts = kernel.statements
    if len(stmts) < 2 or (reducing and not any(s.reduce for s in stmts)):
        return None
    lead = _leading(stmts)
    if lead is None:
        return None
    if max_row is not None and any(math.prod(extents(s)[len(lead) :]) > max_row for s in stmts):
        return None
    *units, row = lead
    nests, vector = [], []
    for stmt in stmts:
        if stmt.name in orders:
            plan = LoopNest(tuple(orders[stmt.name]), vectorize=True)
        else:
            plan = loop_nest(stmt, buffers, keep=row)
        order = [e for e in plan.order if e not in lead]
        if row not in plan.order:
            return None  # coalesced with an inner dim
        inner = tuple(Var(loop_name(e), e) for e in order)
        nests.append(Nest(stmt.name, (*(Var(d, d) for d in lead), *inner)))
        if plan.vectorize and inner:
            vector.append(inner[-1].name)
    state = State(kernel, tuple(nests))
    host = stmts[0].name
    for stmt, nest in zip(stmts[1:], nests[1:], strict=True):
        state = state.with_attach(stmt.name, host, len(units), nest)
    deps = dependences(kernel)
    if broken_order(state, deps) is not None:
        return None
    for name in dict.fromkeys(vector):
        with contextlib.suppress(ScheduleError):
            state = annotate.vectorize(state, deps, name)
    return state.to_kernel_schedule()


def _leading(stmts) -> list[str] | None:
    """The dims every statement starts with: any of extent 1, then the row dim (at least
    MIN_ROWS values, the same in every statement); None when there is no such row."""
    first = stmts[0]
    names, sizes = dim_names(first), extents(first)
    lead = []
    for name, size in zip(names, sizes, strict=True):
        lead.append(name)
        if size != 1:
            break
    if not lead or sizes[len(lead) - 1] < MIN_ROWS:
        return None
    for stmt in stmts[1:]:
        if dim_names(stmt)[: len(lead)] != lead or extents(stmt)[: len(lead)] != sizes[: len(lead)]:
            return None
    return lead
