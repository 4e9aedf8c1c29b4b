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
    (POOL_PLANE), else pass by pass.

    Measured 1 thread, one process, pass by pass -> a channel at a time, against
    onnxruntime: MaxPool 3x3 s2 64x112x112 pad 1 0.83 -> 0.69, 192x56x56 1.07 -> 0.98,
    320x28x28 1.07 -> 0.99, AveragePool 3x3 s2 24x56x56 0.70 -> 0.56, 2x2 s2 128x56x56
    0.42 -> 0.35. Through a padded copy it loses on big planes: AveragePool 3x3
    256x28x28 0.78 -> 0.87, MaxPool 5x5 64x112x112 1.21 -> 1.45."""
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
and the threads take whole channels. Measured 3x3, pass by pass -> a channel at a time,
1 thread (2 threads): 136x28x28 65 -> 56 us (81 -> 33), 272x14x14 33 -> 31 (56 -> 25);
but 544x7x7 (81-point padded planes) 26 -> 33 (26 -> 33)."""


def _plain(kernel: Kernel, buffers: Mapping[str, Buffer]) -> KernelSchedule:
    """Each statement in its default nest (as a State, so marks can be added)."""
    nests, vector = [], []
    several = len(kernel.statements) > 1
    for stmt in kernel.statements:
        plan = loop_nest(stmt, buffers)
        loops = tuple(Var(loop_name(e, stmt.name if several else None), e) for e in plan.order)
        nests.append(Nest(stmt.name, loops))
        if plan.vectorize and loops:
            vector.append(loops[-1].name)
    state = State(kernel, tuple(nests))
    for name in vector:
        state = state.with_mark(name, VECTORIZE)
    return state.to_kernel_schedule()


def _with_threads(schedule: KernelSchedule) -> KernelSchedule:
    """The outermost loop of each big statement on threads, where that is legal."""
    state = schedule.state
    if state is None:
        return schedule
    deps = None
    total = sum(_work(s) for s in state.kernel.statements)
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
        if sum(_work(s) for s in group) < least:  # a fused group: all of it
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
in L1 between passes. Measured in light Inception-v2, 1 thread, per pass -> per channel:
AveragePool 3x3 576x14x14 0.107 -> 0.090 ms, MaxPool 576x14x14 0.073 -> 0.045, 1024x7x7
0.065 -> 0.052; but AveragePool 256x28x28 (900-point planes) 0.205 -> 0.298, MaxPool
320x28x28 0.112 -> 0.143, and 192x56x56 standalone 464 -> 738 us."""

PARALLEL_POINTS = 1 << 16
"""Statement instances (64K, some 5 us of work) from which a non-contraction kernel's
outermost loop runs on threads. Handing a loop to the worker pool (emit/pool.py) costs a
few microseconds; with it, the perf suite's row-fused Softmax 512x1024 (2M points) went
from 211 us on one thread to 136 us on two (it was 266 us when each parallel loop started
its own pthreads), LayerNorm 512x768 from 99 to 63 us. It was 1M until the pools of the
small CNNs were measured, 2 threads, alternating rounds with onnxruntime, 1M -> 256K ->
64K: ShuffleNet 0.97 -> 0.92 -> 0.87, SqueezeNet 0.97 -> 0.95 -> 0.94 (its 3x3 stride-2
MaxPools, 840K loads, 35 and 17 us, had run on one thread); 16K measured alike. Inception
v1 and v2, DenseNet-121 and the suite's Softmax, LayerNorm, elementwise chain and
depthwise Conv within 1-2%.

Work counts a point once per load (:func:`_work`). In a kernel of PARALLEL_POINTS work or
more, every loop group of at least 1/PASSES of it runs on threads: the pool is awake then.
Measured 2 threads (1 thread), the passes of a pool through a padded copy: AveragePool
3x3 576x14x14 77 -> 45 us (73), 192x56x56 469 -> 331 us (453-517). An Add+Relu of 800K
points stays at 86-122 us on 1 or 2 threads either way (bound by memory)."""
PASSES = 8

TRANSFORMS = ("WinogradInput", "WinogradOutput")
"""The kernels of a Winograd Conv's input and output transforms (krnl/ops/winograd.py),
scheduled a channel at a time (row fusion): the input's padded plane stays in L1 through
its passes, and each kernel hands the worker pool one loop, not one a pass. Measured, one
pass after another -> a channel at a time, light models to onnxruntime, one process:
2 threads ResNet-50 1.044 -> 1.016, VGG-19 0.775 -> 0.744; 1 thread alike (1.034 ->
1.030, 0.698 -> 0.711)."""
TRANSFORM_POINTS = 1 << 14
"""Work (as :func:`_work` counts it) from which each pass of a Winograd Conv's input or
output transform (krnl/ops/winograd.py) runs on threads: its points are sums of several
values, several times the cost of the points PARALLEL_POINTS counts, and its passes are
each far below that. Measured 2 threads, light models to onnxruntime, one process, serial
-> threaded (1 << 16 alike): ResNet-50 0.983 -> 0.959 and 1.045 -> 1.024, VGG-19 0.806 ->
0.729, AlexNet 0.774 -> 0.746, SqueezeNet 0.971 -> 0.966."""


def _gemm_params(geo: Geometry, lanes: int, registers: int) -> Params | None:
    if not worth_it(geo, lanes):
        return None
    return default_params(geo, lanes, registers)


def _work(stmt: Statement) -> int:
    """A statement's points, each counted once per load (at least once): a pool's
    unrolled 3x3 window reads 9 values a point."""
    return math.prod(extents(stmt)) * max(1, len(loads(stmt.expr)))
