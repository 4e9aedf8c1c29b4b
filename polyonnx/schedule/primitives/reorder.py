"""reorder(*loops): the named loops take the positions they occupy, in the given order
(positions of other loops are untouched). In a statement that has only some of them,
those keep the given relative order.

    before:  for i / for j / for k      after reorder(k, i):  for k / for j / for i
"""

from __future__ import annotations

from collections.abc import Sequence

from polyonnx.errors import ScheduleError
from polyonnx.schedule.state import Nest, State


def reorder(state: State, loops: Sequence[str]) -> State:
    if len(set(loops)) != len(loops):
        raise ScheduleError(f"reorder({', '.join(loops)}): a loop is named twice")
    nests = []
    for nest in state.nests:
        names = nest.names()
        chosen = [name for name in loops if name in names]
        slots = sorted(names.index(name) for name in chosen)
        order = list(nest.loops)
        for slot, name in zip(slots, chosen, strict=True):
            order[slot] = nest.loops[names.index(name)]
        nests.append(Nest(nest.statement, tuple(order)))
    return state.with_nests(tuple(nests))
