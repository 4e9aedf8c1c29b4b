"""Legality of a schedule state against a kernel's dependences.

``broken_order``: every dependence still runs source before sink. ``carried``: the
dependences a loop carries (two iterations of the loop touch the same element, one of
them writing, with every loop outside it equal): such a loop may not run in parallel,
and may run in SIMD lanes only when it carries nothing but a reduction's own chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyonnx.krnl.islutil import named_access, parse_set, visit
from polyonnx.schedule.deps import describe_pair, violations
from polyonnx.schedule.state import State, time_map


@dataclass(frozen=True)
class Carried:
    statement: str
    pair: str
    reduction_only: bool
    """True when every carried pair is a reduction statement updating one element."""


def broken_order(state: State, deps: isl.UnionMap) -> str | None:
    """One dependence the state runs out of order, described, or None if it is legal."""
    bad = violations(state.to_kernel_schedule(), deps)
    return None if bad.is_empty() else describe_pair(bad)


def carried(state: State, deps: isl.UnionMap, loop: str) -> list[Carried]:
    """The statements whose own dependences ``loop`` carries."""
    found = []
    for nest in state.nests_with(loop):
        stmt = state.statement(nest.statement)
        position = nest.position(loop)
        times = time_map(stmt, nest)
        selfdeps = _self_dependences(deps, stmt.name)
        if selfdeps.is_empty():
            continue
        across = _differ_at(len(nest.loops), position)
        pairs = selfdeps.intersect(times.apply_range(across).apply_range(times.reverse()))
        if pairs.is_empty():
            continue
        reduction_only = stmt.reduce is not None and pairs.is_subset(_same_element(stmt))
        found.append(Carried(stmt.name, describe_pair(pairs), reduction_only))
    return found


def _self_dependences(deps: isl.UnionMap, name: str) -> isl.Map:
    for piece in _maps(deps):
        ends = piece.get_tuple_name(isl.dim_type.in_), piece.get_tuple_name(isl.dim_type.out)
        if ends == (name, name):
            return piece
    return isl.Map("{ [] -> [] : false }")


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    return [m for (m,) in visit(umap, "foreach_map")]


def _differ_at(rank: int, position: int) -> isl.Map:
    t = [f"t{r}" for r in range(rank)]
    u = [f"u{r}" for r in range(rank)]
    same = [f"{a} = {b}" for a, b in zip(t[:position], u[:position], strict=True)]
    cond = " and ".join([*same, f"{t[position]} != {u[position]}"])
    return isl.Map(f"{{ [{', '.join(t)}] -> [{', '.join(u)}] : {cond} }}")


def _same_element(stmt) -> isl.Map:
    write = named_access(stmt.write, "W").intersect_domain(parse_set(stmt.domain))
    return write.apply_range(write.reverse())
