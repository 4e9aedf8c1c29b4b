"""split(loop, factor): one loop becomes an outer loop over blocks of ``factor`` iterations
and an inner loop within a block. Factors need not divide the extent: isl bounds the last
block.

    before:  for i in 0..97            after split(i, 32):  for i_o in 0..3
               body(i)                                          for i_i in 0..min(31, 96 - 32*i_o)
                                                                  body(32*i_o + i_i)
"""

from __future__ import annotations

from polyonnx.errors import ScheduleError
from polyonnx.schedule.state import Nest, State, Var


def split(state: State, loop: str, factor: int) -> tuple[State, str, str]:
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
        raise ScheduleError(f"split({loop}, {factor!r}): the factor must be a positive int")
    if state.marks.get(loop):
        raise ScheduleError(
            f"split({loop}, {factor}): {loop} is already marked {sorted(state.marks[loop])}; "
            "split before marking"
        )
    outer, inner = fresh(state, f"{loop}_o"), fresh(state, f"{loop}_i")
    nests = []
    for nest in state.nests:
        loops: list[Var] = []
        for var in nest.loops:
            if var.name != loop:
                loops.append(var)
                continue
            block = f"floor(({var.expr})/{factor})"
            loops += [Var(outer, block), Var(inner, f"({var.expr}) - {factor}*{block}")]
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
