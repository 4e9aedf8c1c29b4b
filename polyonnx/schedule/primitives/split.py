"""split(loop, factor): one loop becomes an outer loop over blocks of ``factor`` iterations
and an inner loop within a block. Factors need not divide the extent: isl bounds the last
block.

    before:  for i in 0..97            after split(i, 32):  for i_o in 0..3
               body(i)                                          for i_i in 0..min(31, 96 - 32*i_o)
                                                                  body(32*i_o + i_i)
"""

from __future__ import annotations

import numbers

import numpy as np

from polyonnx.errors import ScheduleError
from polyonnx.schedule.state import MAX_LOOPS, Nest, State, Var


def is_int(value: object) -> bool:
    """An integer (numpy's too), not a bool: True is no split factor."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


MAX_FACTOR = 1 << 62
"""The largest split factor: loop bounds are 64-bit integers in native code."""


def split(state: State, loop: str, factor: int) -> tuple[State, str, str]:
    if not is_int(factor) or not 1 <= factor <= MAX_FACTOR:
        raise ScheduleError(
            f"split({loop}, {factor!r:.80}): the factor must be a positive int, at most 2**62; "
            f"given {type(factor).__name__}"
        )
    factor = int(factor)
    if state.marks.get(loop):
        raise ScheduleError(
            f"split({loop}, {factor}): {loop} is already marked {sorted(state.marks[loop])}; "
            "split before marking"
        )
    deepest = max(len(n.loops) for n in state.nests_with(loop))
    if deepest >= MAX_LOOPS:
        raise ScheduleError(
            f"split({loop}, {factor}): {loop} is in a nest of {deepest} loops already, and a "
            f"nest may have at most {MAX_LOOPS} (schedule/state.py MAX_LOOPS)"
        )
    outer, inner = fresh(state, f"{loop}_o"), fresh(state, f"{loop}_i")
    nests = []
    for nest in state.nests:
        loops: list[Var] = []
        for var in nest.loops:
            if var.name != loop:
                loops.append(var)
                continue
            loops += [
                Var(outer, f"floor(({var.expr})/{factor})"),
                Var(inner, f"({var.expr}) mod {factor}"),
            ]  # the loop's expression once in each: nested splits grow it linearly
        nests.append(Nest(nest.statement, tuple(loops)))
    return state.with_nests(tuple(nests)), outer, inner


def fresh(state: State, name: str) -> str:
    """``name``, or ``name2``, ``name3``… if a loop of that name exists already."""
    taken = set(state.loop_names())
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}{n}"
    return candidate
