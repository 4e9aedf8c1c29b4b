"""Default schedules: a loop order and a vectorised loop for each statement, chosen from
the strides of its accesses.

The innermost loop is the dim along which the write is contiguous (or, for a reduction,
unchanged) and the most loads are contiguous; the reduction dims go just outside it, so
``C[i,j] += A[i,k] * B[k,j]`` runs ``i, k, j`` with ``j`` in SIMD lanes, and a row sum
runs its reduction dim in SIMD lanes with a vector accumulator.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel, Statement, loads
from polyonnx.krnl.islutil import dim_names, extents
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.gemm import Geometry, Params, is_ukernel_mark
from polyonnx.schedule.heuristics.blocking import blocked_schedule
from polyonnx.schedule.heuristics.depthwise import depthwise_schedule
from polyonnx.schedule.heuristics.gemm_defaults import default_params, vector_registers, worth_it
from polyonnx.schedule.heuristics.nest import loop_name, loop_nest
from polyonnx.schedule.heuristics.rows import row_fused_schedule
from polyonnx.schedule.heuristics.stencil import stencil_schedule, window_orders
from polyonnx.schedule.heuristics.transpose import transpose_schedule
from polyonnx.schedule.heuristics.ukernel import ukernel_schedule
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.state import PARALLEL, Nest, State, Var
from polyonnx.schedule.tree import VECTORIZE, KernelSchedule
from polyonnx.target import host_target


def default_schedule(
    kernel: Kernel,
    buffers: Mapping[str, Buffer],
    lanes: int | None = None,
    registers: int | None = None,
) -> KernelSchedule:
    """For ``lanes`` float32 SIMD lanes and ``registers`` vector registers (the host's when
    neither is given; given ``lanes`` alone, x86's registers of that width: gemm_defaults.py's
    vector_registers): a contraction as packed GEMM (schedule/heuristics/ukernel.py), a
    depthwise convolution in SIMD row blocks (schedule/heuristics/depthwise.py), or
    register-blocked (schedule/heuristics/blocking.py); a copy that turns rows in tiles
    transposed in registers (schedule/heuristics/transpose.py); a row-wise kernel fused per row
    (schedule/heuristics/rows.py); a pooling window around SIMD rows
    (schedule/heuristics/stencil.py); otherwise each statement in its own default loop nest
    (schedule/heuristics/nest.py). Big kernels of the last three kinds also run their outermost
    loop on threads."""
    if lanes is None:
        host = host_target()
        lanes, registers = host.lanes(4), registers or host.vector_registers
    registers = registers or vector_registers(lanes)
    gemm = ukernel_schedule(kernel, buffers, lambda geo: _gemm_params(geo, lanes, registers))
    if gemm is not None:  # its other statements (a strided Conv's phase copy) on threads
        return _with_threads(gemm)
    depthwise = depthwise_schedule(kernel, buffers, lanes)  # threads: its own
    if depthwise is not None:
        return depthwise
    blocked = blocked_schedule(kernel, buffers, lanes)
    if blocked is not None:
        return blocked
    turned = transpose_schedule(kernel, buffers, lanes)
    if turned is not None:
        return _with_threads(turned)
    if kernel.op_type in TRANSFORMS:  # its passes a channel at a time
        chosen = row_fused_schedule(kernel, buffers, reducing=False)
    elif kernel.op_type == "Conv" and not any(st.reduce for st in kernel.statements):
        chosen = _channel_at_a_time(kernel, buffers)  # a depthwise Conv through a copy
    elif kernel.op_type in POOLS:  # its init, border and interior share n, c: not row-wise
        chosen = _pool_schedule(kernel, buffers, lanes)
    else:
        chosen = row_fused_schedule(kernel, buffers) or stencil_schedule(kernel, buffers, lanes)
    if chosen is None:
        chosen = _plain(kernel, buffers)
    return _with_threads(chosen)


def _pool_schedule(kernel: Kernel, buffers: Mapping[str, Buffer], lanes: int):
    """A pool that reduces windows (its border tap by tap, maybe) a channel at a time,
    each window reduction with its window around SIMD output rows (schedule/heuristics/stencil.py):
    the channel's outputs stay in L1 from its init to its interior. A pool through a
    padded copy (no window reduction) a channel at a time if its planes are small
    (POOL_PLANE), else pass by pass: through a padded copy it loses on big planes
    (docs/measurements.md, 'Pools a channel at a time')."""
    orders = window_orders(kernel, buffers)
    fused = orders and row_fused_schedule(kernel, buffers, reducing=False, orders=orders)
    if fused:
        return fused
    return stencil_schedule(kernel, buffers, lanes) or row_fused_schedule(
        kernel, buffers, reducing=False, max_row=POOL_PLANE
    )


def _channel_at_a_time(kernel: Kernel, buffers: Mapping[str, Buffer]) -> KernelSchedule | None:
    """A depthwise Conv lowered through a padded copy (krnl/ops/conv.py): its passes a
    channel at a time (row fusion) where a channel's planes are CHANNEL_PLANE points."""
    low, high = CHANNEL_PLANE
    planes = [math.prod(extents(st)[2:]) for st in kernel.statements]
    if min(planes) < low:
        return None
    return row_fused_schedule(kernel, buffers, reducing=False, max_row=high)


CHANNEL_PLANE = (128, 4096)
"""Points a channel (the fewest in a pass, the most) for which a depthwise Conv through a
padded copy runs its passes a channel at a time: the planes stay in L1 between passes,
and the threads take whole channels; 81-point padded planes measured slower
(docs/measurements.md, 'Depthwise Convs a channel at a time')."""


def _plain(kernel: Kernel, buffers: Mapping[str, Buffer]) -> KernelSchedule:
    """Each statement in its default nest (as a State, so marks can be added)."""
    plans = [loop_nest(stmt, buffers) for stmt in kernel.statements]
    return nests_state(kernel, plans).to_kernel_schedule()


def nests_state(kernel: Kernel, plans) -> State:
    """Each statement of ``kernel`` in its LoopNest of ``plans`` (in statement order),
    its SIMD loop marked."""
    nests, vector = [], []
    several = len(kernel.statements) > 1
    for stmt, plan in zip(kernel.statements, plans, strict=True):
        loops = tuple(Var(loop_name(e, stmt.name if several else None), e) for e in plan.order)
        nests.append(Nest(stmt.name, loops))
        if plan.vectorize and loops:
            vector.append(loops[-1].name)
    state = State(kernel, tuple(nests))
    for name in vector:
        state = state.with_mark(name, VECTORIZE)
    return state


def _with_threads(schedule: KernelSchedule) -> KernelSchedule:
    """The outermost loop of each big statement on threads, where that is legal."""
    state = schedule.state
    if state is None:
        return schedule
    deps = None
    total = sum(work(s) for s in state.kernel.statements)
    least = PARALLEL_POINTS if total < PARALLEL_POINTS else PARALLEL_POINTS // PASSES
    if state.kernel.op_type in TRANSFORMS:
        least = TRANSFORM_POINTS
    for nest in state.nests:
        stmt = state.statement(nest.statement)
        group = [stmt] + [
            state.statement(g) for g, (h, _) in state.attach.items() if h == stmt.name
        ]
        if nest.statement in state.attach or not nest.loops or _in_gemm(state, nest):
            continue
        if sum(work(s) for s in group) < least:  # a fused group: all of it
            continue
        sizes = dict(zip(dim_names(stmt), extents(stmt), strict=True))
        wide = [
            v for v in nest.loops if sizes.get(v.expr, 2) >= 2
        ]  # a dim's extent, else a merged loop
        if not wide:
            continue
        first = wide[0].name
        if state.marked(first, PARALLEL) or state.marked(first, VECTORIZE):
            continue
        deps = deps if deps is not None else dependences(state.kernel)
        with contextlib.suppress(ScheduleError):
            state = annotate.parallel(state, deps, first)
    return state.to_kernel_schedule() if state is not schedule.state else schedule


def _in_gemm(state: State, nest: Nest) -> bool:
    """Whether the micro-kernel runs this nest (it splits itself over threads)."""
    return any(is_ukernel_mark(m) for v in nest.loops for m in state.marks.get(v.name, ()))


POOLS = ("MaxPool", "AveragePool", "LpPool")
"""Kernels scheduled by :func:`_pool_schedule` (a padded 3x3 MaxPool fused per channel
with its taps innermost, scalar, ran 8x slower than with them around SIMD rows)."""

POOL_PLANE = 512
"""A pool through a padded copy (krnl/ops/pool.py) runs its passes a channel at a time
(row fusion) when no pass has more than this many points a channel: its planes then stay
in L1 between passes; 900-point planes measured slower (docs/measurements.md, 'Pools
through a padded copy a channel at a time')."""

PARALLEL_POINTS = 1 << 16
"""Statement instances (64K, some 5 us of work) from which a non-contraction kernel's
outermost loop runs on threads: handing a loop to the worker pool (emit/pool.py) costs a
few microseconds. It was 1M until the pools of the small CNNs were measured; 16K measured
alike.

Work counts a point once per load (:func:`_work`). In a kernel of PARALLEL_POINTS work or
more, every loop group of at least 1/PASSES of it runs on threads: the pool is awake then
(docs/measurements.md, 'Threading threshold of other kernels')."""
PASSES = 8

TRANSFORMS = ("WinogradInput", "WinogradOutput")
"""The kernels of a Winograd Conv's input and output transforms (krnl/ops/winograd.py),
scheduled a channel at a time (row fusion): the input's padded plane stays in L1 through
its passes, and each kernel hands the worker pool one loop, not one a pass
(docs/measurements.md, 'Winograd transforms a channel at a time')."""
TRANSFORM_POINTS = 1 << 14
"""Work (as :func:`_work` counts it) from which each pass of a Winograd Conv's input or
output transform (krnl/ops/winograd.py) runs on threads: its points are sums of several
values, several times the cost of the points PARALLEL_POINTS counts, and its passes are
each far below that (docs/measurements.md, 'Threading threshold of Winograd
transforms')."""


def _gemm_params(geo: Geometry, lanes: int, registers: int) -> Params | None:
    if not worth_it(geo, lanes):
        return None
    return default_params(geo, lanes, registers)


def work(stmt: Statement) -> int:
    """A statement's points, each counted once per load (at least once): a pool's
    unrolled 3x3 window reads 9 values a point."""
    return math.prod(extents(stmt)) * max(1, len(loads(stmt.expr)))
