"""Default schedules: a loop order and a vectorised loop for each statement, chosen from
the strides of its accesses.

The innermost loop is the dim along which the write is contiguous (or, for a reduction,
unchanged) and the most loads are contiguous; the reduction dims go just outside it, so
``C[i,j] += A[i,k] * B[k,j]`` runs ``i, k, j`` with ``j`` in SIMD lanes, and a row sum
runs its reduction dim in SIMD lanes with a vector accumulator.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyonnx.krnl.ir import REDUCE_OPS, Buffer, Kernel, Statement, loads
from polyonnx.krnl.islutil import dim_names, extents, flat_stride
from polyonnx.schedule.blocking import blocked_schedule
from polyonnx.schedule.gemm import Geometry, Params, default_params, ukernel_schedule, worth_it
from polyonnx.schedule.stencil import stencil_schedule
from polyonnx.schedule.tree import KernelSchedule, LoopNest, sequence_tree

MIN_VECTOR_EXTENT = 4


def default_schedule(
    kernel: Kernel, buffers: Mapping[str, Buffer], lanes: int = 16
) -> KernelSchedule:
    """Register-blocked for a contraction (schedule/blocking.py); otherwise each statement
    in its own loop nest with the innermost loop chosen from access strides."""
    gemm = ukernel_schedule(kernel, buffers, lambda geo: _gemm_params(geo, lanes))
    if gemm is not None:
        return gemm
    blocked = blocked_schedule(kernel, buffers, lanes)
    if blocked is not None:
        return blocked
    stencil = stencil_schedule(kernel, buffers, lanes)
    if stencil is not None:
        return stencil
    return sequence_tree(kernel, [loop_nest(stmt, buffers) for stmt in kernel.statements])


def _gemm_params(geo: Geometry, lanes: int) -> Params | None:
    if not worth_it(geo, lanes):
        return None
    registers = 32 if lanes * 4 >= 64 else 16  # AVX-512 has 32 vector registers
    return default_params(geo, lanes, registers)


def loop_nest(stmt: Statement, buffers: Mapping[str, Buffer]) -> LoopNest:
    names = dim_names(stmt)
    if not names:
        return LoopNest(())
    sizes = extents(stmt)
    scores = {pos: _score(stmt, buffers, pos) for pos in range(len(names))}
    candidates = [p for p, s in scores.items() if s is not None]
    if not candidates:
        return LoopNest(tuple(names))
    inner = max(candidates, key=lambda p: (scores[p], p))
    write_shape = buffers[stmt.write.buffer].shape
    reduced = [p for p in range(len(names)) if flat_stride(stmt.write, write_shape, p) == 0]
    outer = [p for p in range(len(names)) if p != inner and p not in reduced]
    order = [*outer, *(p for p in reduced if p != inner), inner]
    vectorize = sizes[inner] >= MIN_VECTOR_EXTENT
    return LoopNest(tuple(names[p] for p in order), vectorize)


def _score(stmt: Statement, buffers: Mapping[str, Buffer], pos: int) -> int | None:
    """How well SIMD along dim ``pos`` suits the statement; None when it cannot work."""
    write = flat_stride(stmt.write, buffers[stmt.write.buffer].shape, pos)
    if write == 0 and stmt.reduce not in REDUCE_OPS:
        return None
    if write not in (0, 1):
        return None
    score = 2 if write == 1 else 0
    for load in loads(stmt.expr):
        stride = flat_stride(load.access, buffers[load.access.buffer].shape, pos)
        score += {1: 1, 0: 0}.get(stride, -1)
    return score
