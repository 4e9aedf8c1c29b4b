"""A kernel's schedule: an isl schedule tree, held as its isl string so that it is
frozen, picklable and printable. Marks in the tree carry intent for code generation:
``vectorize`` above a one-member band asks for explicit SIMD of that loop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import islpy as isl

from polyonnx.krnl.ir import Kernel, Statement
from polyonnx.krnl.islutil import dim_names, parse_set

if TYPE_CHECKING:
    from polyonnx.schedule.state import State

VECTORIZE = "vectorize"


@dataclass(frozen=True)
class KernelSchedule:
    """One kernel plus the isl schedule tree that orders its statement instances (and,
    when a schedule state built it, that state, whose loop names printing uses)."""

    kernel: Kernel
    tree: str
    state: State | None = field(default=None, compare=False, repr=False)
    panels: tuple[tuple[str, str], ...] = ()
    """(B, its panel copy) for a GEMM whose constant B was packed when compiling
    (schedule/heuristics/panels.py): the kernel's code reads the copy, which it is passed too."""

    gemms: tuple = ()
    """A parametric kernel's contractions as schedule/gemm.py's FittedGemm records (its
    ukernel marks' geometry, which cannot be read off parametric domains)."""

    def buffers(self) -> tuple[str, ...]:
        """The kernel's buffers, then the panel copies: its code's pointer arguments."""
        return (*self.kernel.buffers(), *(copy for _, copy in self.panels))

    def isl_schedule(self) -> isl.Schedule:
        return parse_schedule(self.tree)


@lru_cache(maxsize=1024)
def parse_schedule(tree: str) -> isl.Schedule:
    """A schedule tree from its text, parsed once (isl values are not changed in place)."""
    return isl.Schedule(tree)


@dataclass(frozen=True)
class LoopNest:
    """How one statement's loops are ordered, outermost first, and which (innermost)
    loop, if any, is vectorised."""

    order: tuple[str, ...]
    vectorize: bool = False


def band(stmt: Statement, dims: Sequence[str]) -> isl.MultiUnionPwAff:
    """A band with one member per dim of ``dims``, over ``stmt``'s domain."""
    head = f"{stmt.name}[{', '.join(dim_names(stmt))}]"
    members = ", ".join(f"{{ {head} -> [({d})] }}" for d in dims)
    return isl.MultiUnionPwAff(f"[{members}]")


def sequence_tree(kernel: Kernel, nests: Sequence[LoopNest]) -> KernelSchedule:
    """Run the statements one after another, each in its own loop nest."""
    domain = isl.UnionSet.empty(parse_set(kernel.statements[0].domain).get_space().params())
    filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(kernel.statements))
    for stmt in kernel.statements:
        piece = isl.UnionSet.from_set(parse_set(stmt.domain))
        domain = domain.union(piece)
        filters = filters.add(piece)
    node = isl.Schedule.from_domain(domain).get_root().child(0).insert_sequence(filters)
    for index, (stmt, nest) in enumerate(zip(kernel.statements, nests, strict=True)):
        node = _insert_nest(node.child(index).child(0), stmt, nest).parent()
        while node.get_type() != isl.schedule_node_type.sequence:
            node = node.parent()
    return KernelSchedule(kernel, str(node.get_schedule()))


def _insert_nest(leaf: isl.ScheduleNode, stmt: Statement, nest: LoopNest) -> isl.ScheduleNode:
    """Insert the bands of ``nest`` above ``leaf``; returns the outermost inserted node."""
    order = list(nest.order)
    if not order:
        return leaf
    if not nest.vectorize:
        return leaf.insert_partial_schedule(band(stmt, order))
    node = leaf.insert_partial_schedule(band(stmt, order[-1:])).insert_mark(isl.Id(VECTORIZE))
    if len(order) > 1:
        node = node.insert_partial_schedule(band(stmt, order[:-1]))
    return node
