"""The state a schedule script edits, and its translation into an isl schedule tree.

Each statement has a nest: its loops, outermost first, each an affine expression over the
statement's domain dims (``i``; after a split by 32, ``floor((i)/32)`` and
``(i) mod 32``). A loop is named, and a name stands for that loop in every
statement that has it, so splitting ``i`` in a MatMul splits it in the init and in the
update. Marks (vectorize, unroll, parallel) attach to loop names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import islpy as isl

from polyonnx.krnl.ir import Buffer, Kernel, Statement
from polyonnx.krnl.islutil import dim_names, parse_set
from polyonnx.schedule.tree import VECTORIZE, KernelSchedule

UNROLL = "unroll"
PARALLEL = "parallel"
UKERNEL = "ukernel"
TRANSPOSE = "transpose"
"""On a tile's outer loop: the tile is transposed in registers
(schedule/heuristics/transpose.py)."""
MARKS = (VECTORIZE, UNROLL, PARALLEL)
MAX_LOOPS = 32
"""The deepest nest a split may make (tile and unroll by a factor split too). Each step
checks its legality on isl maps with one dim a loop, at a cost that grows with the cube
of the depth or so: past this, a step would take seconds, and no useful schedule is that
deep (a rank-8 tensor tiled twice has 24 loops)."""


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
    attach: Mapping[str, tuple[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    """Fusion: statement -> (host statement, depth). The statement shares the host's loops
    0..depth; in each iteration of them, statements run in kernel order (a pack copy, put
    before its consumer, runs before the host's inner loops; a fused consumer after)."""
    scratch: Mapping[str, Buffer] = field(default_factory=lambda: MappingProxyType({}))
    """Buffers the schedule introduced (pack copies)."""

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
        return KernelSchedule(self.kernel, str(self.isl_schedule()), self)

    def with_attach(self, statement: str, host: str, depth: int, nest: Nest) -> State:
        attach = dict(self.attach)
        attach[statement] = (host, depth)
        nests = tuple(nest if n.statement == statement else n for n in self.nests)
        return replace(self, nests=nests, attach=MappingProxyType(attach))

    def nest(self, statement: str) -> Nest:
        return next(n for n in self.nests if n.statement == statement)

    def groups(self) -> list[tuple[str, list[str], int]]:
        """(root statement, statements fused into it, depth), in execution order."""
        found = []
        for stmt in self.kernel.statements:
            if stmt.name in self.attach:
                continue
            guests = [s.name for s in self.kernel.statements if self.host(s.name) == stmt.name]
            depth = self.attach[guests[0]][1] if guests else -1
            found.append((stmt.name, guests, depth))
        return found

    def host(self, statement: str) -> str | None:
        return self.attach[statement][0] if statement in self.attach else None

    def isl_schedule(self) -> isl.Schedule:
        """A sequence of the statement groups; a group is one statement, or a host with the
        statements fused into it sharing its outer loops."""
        stmts = self.kernel.statements
        groups = self.groups()
        domain = isl.UnionSet.empty(parse_set(stmts[0].domain).get_space().params())
        filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(groups))
        for root, guests, _ in groups:
            piece = _domains([self.statement(n) for n in [root, *guests]])
            domain = domain.union(piece)
            filters = filters.add(piece)
        top = isl.Schedule.from_domain(domain).get_root().child(0).insert_sequence(filters)
        order = [st.name for st in stmts]
        for index, (root, guests, depth) in enumerate(groups):
            leaf = top.child(index).child(0)
            if guests:
                members = sorted([root, *guests], key=order.index)
                node = self._insert_group(leaf, members, depth)
            else:
                node = self._insert_nest(leaf, self.statement(root), self.nest(root))
            top = node.ancestor(node.get_tree_depth() - top.get_tree_depth())
        return top.get_schedule()

    def _insert_group(
        self, leaf: isl.ScheduleNode, names: list[str], depth: int
    ) -> isl.ScheduleNode:
        """Shared bands for loops 0..depth over every statement of the group, then a
        sequence of the statements, each with its own inner loops."""
        filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(names))
        for name in names:
            filters = filters.add(_domains([self.statement(name)]))
        seq = leaf.insert_sequence(filters)
        for index, name in enumerate(names):
            inner = Nest(name, self.nest(name).loops[depth + 1 :])
            node = self._insert_nest(
                seq.child(index).child(0), self.statement(name), inner, depth + 1
            )
            seq = node.ancestor(node.get_tree_depth() - seq.get_tree_depth())
        shared = [(self.statement(n), self.nest(n).loops[: depth + 1]) for n in names]
        return self._insert_bands(seq, shared)

    def _insert_nest(
        self, leaf: isl.ScheduleNode, stmt: Statement, nest: Nest, shared: int = 0
    ) -> isl.ScheduleNode:
        """``nest``'s loops as bands; the statement's first ``shared`` loops are its group's,
        in bands above ``leaf``."""
        return self._insert_bands(leaf, [(stmt, nest.loops)], shared)

    def _insert_bands(self, node: isl.ScheduleNode, members, shared: int = 0) -> isl.ScheduleNode:
        """Bands above ``node`` from the innermost loop out, for statements that share these
        loops (``members``: (statement, loops) with equal loop names position by position).
        A marked loop gets a band (and mark) of its own; unmarked runs share one band."""
        count = len(members[0][1])
        pending: list[int] = []
        for position in reversed(range(count)):
            marks = self.marks.get(members[0][1][position].name, frozenset())
            if not marks:
                pending.insert(0, position)
                continue
            if pending:
                node = node.insert_partial_schedule(shared_band(members, pending))
                pending = []
            node = node.insert_partial_schedule(shared_band(members, [position]))
            outer = [(st, self.nest(st.name).loops[:shared] + lp) for st, lp in members]
            if _single_valued(outer, shared + position):
                marks = marks - {VECTORIZE, PARALLEL, TRANSPOSE}  # isl emits no loop to mark
            if UNROLL in marks:
                node = node.band_member_set_ast_loop_type(0, isl.ast_loop_type.unroll)
            for mark in sorted(m for m in marks if m.startswith(UKERNEL)):
                node = node.insert_mark(isl.Id(mark))
            for mark in (VECTORIZE, PARALLEL, TRANSPOSE):
                if mark in marks:
                    node = node.insert_mark(isl.Id(mark))
        if pending:
            node = node.insert_partial_schedule(shared_band(members, pending))
        return node


def _single_valued(members, position: int) -> bool:
    """Whether the loop at ``position`` takes one value for each value of the loops outside
    it (a split dim of extent 1, say). isl then emits no loop for it, and a mark on it would
    sit on whatever comes next: a parallel mark right above a reduction loop ran that loop
    on threads, which raced on the sums."""
    values = None
    for stmt, loops in members:
        times = time_map(stmt, Nest(stmt.name, tuple(loops[: position + 1]))).range()
        values = times if values is None else values.union(times)
    relation = isl.Map.from_range(values).move_dims(
        isl.dim_type.in_, 0, isl.dim_type.out, 0, position
    )
    return relation.is_single_valued()


def band(stmt: Statement, loops: list[Var]) -> isl.MultiUnionPwAff:
    return shared_band([(stmt, loops)], list(range(len(loops))))


def shared_band(members, positions: list[int]) -> isl.MultiUnionPwAff:
    """One band member per position, each a union over the statements of their loop at it."""
    columns = []
    for position in positions:
        pieces = [
            f"{stmt.name}[{', '.join(dim_names(stmt))}] -> [({loops[position].expr})]"
            for stmt, loops in members
        ]
        columns.append("{ " + "; ".join(pieces) + " }")
    return isl.MultiUnionPwAff(f"[{', '.join(columns)}]")


def _domains(stmts) -> isl.UnionSet:
    found = isl.UnionSet.from_set(parse_set(stmts[0].domain))
    for stmt in stmts[1:]:
        found = found.union(isl.UnionSet.from_set(parse_set(stmt.domain)))
    return found


def time_map(stmt: Statement, nest: Nest) -> isl.Map:
    """The statement's instances mapped to their loop values, outermost first."""
    head = f"{stmt.name}[{', '.join(dim_names(stmt))}]"
    values = ", ".join(f"({v.expr})" for v in nest.loops)
    return isl.Map(f"{{ {head} -> [{values}] }}").intersect_domain(parse_set(stmt.domain))
