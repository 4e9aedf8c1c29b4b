"""The state a schedule script edits, and its translation into an isl schedule tree.

Each statement has a nest: its loops, outermost first, each an affine expression over the
statement's domain dims (``i``; after a split by 32, ``floor(i/32)`` and
``i - 32*floor(i/32)``). A loop is named, and a name stands for that loop in every
statement that has it, so splitting ``i`` in a MatMul splits it in the init and in the
update. Marks (vectorize, unroll, parallel) attach to loop names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import islpy as isl

from polyonnx.krnl.ir import Kernel, Statement
from polyonnx.krnl.islutil import dim_names, parse_set
from polyonnx.schedule.tree import VECTORIZE, KernelSchedule

UNROLL = "unroll"
PARALLEL = "parallel"
MARKS = (VECTORIZE, UNROLL, PARALLEL)


@dataclass(frozen=True)
class Var:
    """One loop of a statement: its name and its value as an affine expression."""

    name: str
    expr: str


@dataclass(frozen=True)
class Nest:
    statement: str
    loops: tuple[Var, ...]

    def names(self) -> list[str]:
        return [v.name for v in self.loops]

    def position(self, name: str) -> int | None:
        names = self.names()
        return names.index(name) if name in names else None


@dataclass(frozen=True)
class State:
    """A kernel's loop nests and marks. Transformations return new states."""

    kernel: Kernel
    nests: tuple[Nest, ...]
    marks: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))

    @staticmethod
    def original(kernel: Kernel) -> State:
        """Every statement over its dims in declaration order, nothing marked."""
        nests = tuple(
            Nest(s.name, tuple(Var(d, d) for d in dim_names(s))) for s in kernel.statements
        )
        return State(kernel, nests)

    def with_nests(self, nests: tuple[Nest, ...]) -> State:
        return replace(self, nests=nests)

    def with_mark(self, loop: str, mark: str) -> State:
        marks = dict(self.marks)
        marks[loop] = frozenset(marks.get(loop, frozenset()) | {mark})
        return replace(self, marks=MappingProxyType(marks))

    def marked(self, loop: str, mark: str) -> bool:
        return mark in self.marks.get(loop, frozenset())

    def nests_with(self, loop: str) -> list[Nest]:
        return [n for n in self.nests if loop in n.names()]

    def loop_names(self) -> list[str]:
        """Every loop name, in order of first appearance (outermost first)."""
        seen: dict[str, None] = {}
        for nest in self.nests:
            for name in nest.names():
                seen.setdefault(name)
        return list(seen)

    def statement(self, name: str) -> Statement:
        return next(s for s in self.kernel.statements if s.name == name)

    def to_kernel_schedule(self) -> KernelSchedule:
        return KernelSchedule(self.kernel, str(self.isl_schedule()))

    def isl_schedule(self) -> isl.Schedule:
        """A sequence of the statements, each with its bands and marks."""
        stmts = self.kernel.statements
        domain = isl.UnionSet.empty(parse_set(stmts[0].domain).get_space().params())
        filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(stmts))
        for stmt in stmts:
            piece = isl.UnionSet.from_set(parse_set(stmt.domain))
            domain = domain.union(piece)
            filters = filters.add(piece)
        node = isl.Schedule.from_domain(domain).get_root().child(0).insert_sequence(filters)
        for index, (stmt, nest) in enumerate(zip(stmts, self.nests, strict=True)):
            node = self._insert_nest(node.child(index).child(0), stmt, nest)
            while node.get_type() != isl.schedule_node_type.sequence:
                node = node.parent()
        return node.get_schedule()

    def _insert_nest(self, leaf: isl.ScheduleNode, stmt: Statement, nest: Nest) -> isl.ScheduleNode:
        """Bands from the innermost loop out: a marked loop gets a band (and mark) of its
        own, runs of unmarked loops share one band."""
        node = leaf
        pending: list[Var] = []
        for var in reversed(nest.loops):
            marks = self.marks.get(var.name, frozenset())
            if not marks:
                pending.insert(0, var)
                continue
            if pending:
                node = node.insert_partial_schedule(band(stmt, pending))
                pending = []
            node = node.insert_partial_schedule(band(stmt, [var]))
            if UNROLL in marks:
                node = node.band_member_set_ast_loop_type(0, isl.ast_loop_type.unroll)
            for mark in (VECTORIZE, PARALLEL):
                if mark in marks:
                    node = node.insert_mark(isl.Id(mark))
        if pending:
            node = node.insert_partial_schedule(band(stmt, pending))
        return node


def band(stmt: Statement, loops: list[Var]) -> isl.MultiUnionPwAff:
    head = f"{stmt.name}[{', '.join(dim_names(stmt))}]"
    members = ", ".join(f"{{ {head} -> [({v.expr})] }}" for v in loops)
    return isl.MultiUnionPwAff(f"[{members}]")


def time_map(stmt: Statement, nest: Nest) -> isl.Map:
    """The statement's instances mapped to their loop values, outermost first."""
    head = f"{stmt.name}[{', '.join(dim_names(stmt))}]"
    values = ", ".join(f"({v.expr})" for v in nest.loops)
    return isl.Map(f"{{ {head} -> [{values}] }}").intersect_domain(parse_set(stmt.domain))
