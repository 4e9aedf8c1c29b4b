"""Default schedule for windowed reductions (pooling, stencils): the window loops go
outside a SIMD loop along the output row.

A pool's update ``Y[n, c, o0, o1] max= X[n, c, s*o0 + k0 - p, s*o1 + k1 - p]`` has window
dims (k0, k1) that the write does not depend on. The plain default runs them innermost,
scalar, with bounds that depend on the output position (the padding constraints), so
every output is a short scalar loop of NaN-aware maxima. Here the statement becomes

    for n / for c / for o0 / for k0 / for k1
        for o1 (SIMD)                       o1's bounds depend on k1 only (the padding)
            Y[n, c, o0, o1] = max(Y[n, c, o0, o1], X[n, c, s*o0 + k0 - p, s*o1 + k1 - p])

so each tap is one vector step over a row of outputs that stays in L1; the padding only
trims where each tap's row starts and ends. Every other statement of the kernel that has
the SIMD loop (the init, AveragePool's divide and tap counts, MaxPool's Indices) gets the
same order, so the one loop name is innermost, and vectorised, everywhere.

    before:  for n, c, o0, o1 / for k0 = max(0, p - s*o0).. / for k1 = max(0, p - s*o1)..
    after:   for n, c, o0 / for k0 = max(0, p - s*o0).. / for k1 / SIMD for o1 = lo(k1)..hi(k1)
"""

from __future__ import annotations

from collections.abc import Mapping

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel, Statement, loads
from polyonnx.krnl.islutil import dim_names, extents, flat_stride
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.primitives.reorder import reorder
from polyonnx.schedule.state import State
from polyonnx.schedule.tree import KernelSchedule

WINDOW_OPS = ("max", "min", "add")
MIN_ROW = 4
"""Outputs along the SIMD row below which the window loop is left innermost (a global
window: one output, nothing to run side by side)."""
MAX_ROW_STRIDE = 4
"""The largest step of a load along the SIMD row: a pool's stride. A longer step (the
channels of a global pool) is better left to the default, which reduces the window in
SIMD lanes instead."""


def stencil_schedule(
    kernel: Kernel, buffers: Mapping[str, Buffer], lanes: int
) -> KernelSchedule | None:
    """The window-outside, row-in-SIMD schedule of a kernel with a windowed reduction, or
    None when the kernel has none (or the order would not be legal)."""
    orders = window_orders(kernel, buffers)
    if not orders:
        return None
    state = State.original(kernel)
    for order in orders.values():
        state = reorder(state, order)
    deps = dependences(kernel)
    if broken_order(state, deps) is not None:
        return None
    try:
        for row in dict.fromkeys(order[-1] for order in orders.values()):
            state = annotate.vectorize(state, deps, row)
    except ScheduleError:  # some statement cannot take a row innermost: keep the default
        return None
    return state.to_kernel_schedule()


def window_orders(kernel: Kernel, buffers: Mapping[str, Buffer]) -> dict[str, list[str]]:
    """Per windowed reduction of the kernel, its dims in this schedule's order (outer,
    window, then the SIMD row)."""
    plans = {s.name: _plan(s, buffers) for s in kernel.statements}
    return {name: [*p[2], *p[1], p[0]] for name, p in plans.items() if p is not None}


Plan = tuple[str, list[str], list[str]]


def _plan(stmt: Statement, buffers: Mapping[str, Buffer]) -> Plan | None:
    """(SIMD row dim, window dims, outer dims) of a windowed reduction, else None.

    The row is the dim along which the write is contiguous and every load moves by at most
    MAX_ROW_STRIDE elements (a run of output positions, not channels); the window
    dims are those the write does not depend on and some load moves along. A product of two
    loads (a contraction) is not a window."""
    if stmt.reduce not in WINDOW_OPS:
        return None
    reads = loads(stmt.expr)
    if not reads:
        return None
    if len({x.access.buffer for x in reads}) != 1:
        return None
    names = dim_names(stmt)
    sizes = extents(stmt)
    shape = buffers[stmt.write.buffer].shape
    writes = [flat_stride(stmt.write, shape, p) for p in range(len(names))]
    moves = [
        [flat_stride(x.access, buffers[x.access.buffer].shape, p) for x in reads]
        for p in range(len(names))
    ]
    rows = [
        p for p in range(len(names))
        if writes[p] == 1
        and sizes[p] >= MIN_ROW
        and all(m is not None and 0 < abs(m) <= MAX_ROW_STRIDE for m in moves[p])
    ]  # fmt: skip
    window = [
        p for p in range(len(names)) if writes[p] == 0 and any(m not in (0, None) for m in moves[p])
    ]
    if not rows or not window or any(w is None for w in writes):
        return None
    row = rows[-1]
    outer = [names[p] for p in range(len(names)) if p != row and p not in window]
    return names[row], [names[p] for p in window], outer
