"""Marks: vectorize, unroll and parallel. Each checks its preconditions and returns a
new state, or raises ScheduleError saying why not and what would work.

- vectorize(loop): the loop is innermost wherever it appears, and carries no dependence
  except a reduction's own chain (summed in SIMD lanes, reassociated as with fast-math).
- unroll(loop): full unroll of a loop of at most MAX_UNROLL iterations (use a factor for
  longer loops: split, then unroll the inner loop).
- parallel(loop): the loop carries no dependence at all; one parallel loop per nest.
"""

from __future__ import annotations

import islpy as isl

from polyonnx.errors import ScheduleError
from polyonnx.schedule.legality import carried
from polyonnx.schedule.state import PARALLEL, UKERNEL, UNROLL, State, time_map
from polyonnx.schedule.tree import VECTORIZE

MAX_UNROLL = 64


def vectorize(state: State, deps: isl.UnionMap, loop: str) -> State:
    for nest in state.nests_with(loop):
        if nest.names()[-1] != loop:
            raise ScheduleError(
                f"vectorize({loop}): {loop} is not the innermost loop of {nest.statement} "
                f"(loops {', '.join(nest.names())}); reorder it innermost first"
            )
    blocking = [c for c in carried(state, deps, loop) if not c.reduction_only]
    if blocking:
        raise ScheduleError(
            f"vectorize({loop}): {loop} carries a dependence of {blocking[0].statement} "
            f"({blocking[0].pair}), so its iterations cannot run side by side"
        )
    return state.with_mark(loop, VECTORIZE)


def unroll(state: State, loop: str) -> State:
    for nest in state.nests_with(loop):
        stmt = state.statement(nest.statement)
        extent = _extent(time_map(stmt, nest), nest.position(loop))
        if extent > MAX_UNROLL:
            raise ScheduleError(
                f"unroll({loop}): {loop} runs {extent} iterations in {stmt.name}; a full "
                f"unroll is limited to {MAX_UNROLL}: give a factor, unroll({loop}, 4)"
            )
    return state.with_mark(loop, UNROLL)


def parallel(state: State, deps: isl.UnionMap, loop: str) -> State:
    for nest in state.nests_with(loop):
        inner = nest.names()[nest.position(loop) + 1 :]
        threaded = [m for n in inner for m in state.marks.get(n, ()) if _splits(m)]
        if threaded:
            raise ScheduleError(
                f"parallel({loop}): {nest.statement}'s GEMM already runs on threads "
                f"({threaded[0]}); nested parallel regions are not supported: give the "
                "ukernel split='none' to parallelise this loop instead"
            )
        others = [n for n in nest.names() if n != loop and state.marked(n, PARALLEL)]
        if others:
            raise ScheduleError(
                f"parallel({loop}): {nest.statement} already runs {others[0]} in parallel; "
                "nested parallel loops are not supported"
            )
    blocking = carried(state, deps, loop)
    if blocking:
        first = blocking[0]
        nest = next(n for n in state.nests if n.statement == first.statement)
        free = [n for n in nest.names() if n != loop and not carried(state, deps, n)]
        what = "a reduction" if first.reduction_only else "a dependence"
        hint = f"parallelise {' or '.join(free)}" if free else "no loop of it is parallel"
        if first.reduction_only:
            hint += f", or split {loop} and reduce the partial sums"
        raise ScheduleError(
            f"parallel({loop}): {loop} carries {what} in {first.statement} ({first.pair}): {hint}"
        )
    return state.with_mark(loop, PARALLEL)


def _extent(times: isl.Map, position: int) -> int:
    values = times.range()
    if values.is_empty():
        return 0
    lo = values.dim_min_val(position).to_python()
    hi = values.dim_max_val(position).to_python()
    return int(hi - lo + 1)


def _splits(mark: str) -> bool:
    """A ukernel mark whose GEMM is split over threads."""
    return (
        mark.startswith(UKERNEL + "_")
        and not mark.endswith("splitnone")
        and "_splitnone_" not in mark
    )


def broken_marks(state: State, deps: isl.UnionMap) -> str | None:
    """Why a mark of ``state`` no longer holds under ``deps``, or None. A step that adds
    statements (pack) adds dependences: a pack copy inside a parallel loop would have the
    loop's threads share one scratch buffer, and inside a vectorized loop it would leave
    that loop no longer innermost."""
    for loop in state.loop_names():
        if state.marked(loop, PARALLEL):
            blocking = carried(state, deps, loop)
            if blocking:
                return (
                    f"would have the threads of parallel loop {loop} share the buffer that "
                    f"{blocking[0].statement} writes ({blocking[0].pair}): pack at a loop "
                    f"outside {loop}"
                )
        if state.marked(loop, VECTORIZE):
            try:
                vectorize(state, deps, loop)
            except ScheduleError as refused:
                return f"would leave the vectorized loop {loop} illegal: {refused}"
    return None
