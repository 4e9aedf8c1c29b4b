"""Fusion: several kernels scheduled as one, and compute_at.

``merge`` renames the statements of consecutive kernels (``mm``'s S1 becomes ``mm_S1``)
into one kernel, so one schedule orders them all and dependence analysis sees across them.

``compute_at(state, guests, loop)`` runs the guest statements inside ``loop`` of the last
other statement that has it (the host), after the host's inner loops:

    for i / for j { for k: T[i][j] += A[i][k]*B[k][j];  Y[i][j] = max(T[i][j] + b[j], 0) }

The guests' outer loops are aligned through dataflow: a guest instance runs in the host
iteration that produces (or consumes) the element it reads (or writes), which must be one
iteration. ``inline_fused`` then removes what fusion made needless: a fused producer whose
output is only read, element for element, by later statements of the same fused
iteration is substituted into them, and its buffer disappears.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import islpy as isl

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import (
    Access,
    Expr,
    Iter,
    Kernel,
    Load,
    Statement,
    children,
    gathers,
    loads,
    map_loads,
    renamed,
)
from polyonnx.krnl.islutil import dim_names, named_access, parse_access, visit
from polyonnx.schedule.state import Nest, State, Var, time_map


def merge(kernels: Sequence[Kernel]) -> Kernel:
    statements = []
    for kernel in kernels:
        prefix = re.sub(r"\W", "_", kernel.name)
        statements += [renamed(s, f"{prefix}_{s.name}") for s in kernel.statements]
    name = "+".join(k.name for k in kernels)
    return Kernel(name, "+".join(k.op_type for k in kernels), tuple(statements))


# ---- compute_at -----------------------------------------------------------------------


def compute_at(state: State, guests: Sequence[str], loop: str) -> State:
    hosts = [
        n for n in state.nests
        if loop in n.names() and n.statement not in guests and n.statement not in state.attach
    ]  # fmt: skip
    if not hosts:
        raise ScheduleError(f"compute_at({loop}): no other statement runs a loop {loop}")
    host = hosts[-1]
    depth = host.position(loop)
    placed = [host.statement] + [s for s, (h, _) in state.attach.items() if h == host.statement]
    for s, (h, d) in state.attach.items():
        if h == host.statement and d != depth:
            raise ScheduleError(f"compute_at({loop}): {s} is already fused at another loop of {h}")
    for guest in guests:
        nest = _aligned(state, guest, placed, host, depth)
        state = state.with_attach(guest, host.statement, depth, nest)
        placed.append(guest)
    return state


def _aligned(state: State, guest: str, placed: list[str], host: Nest, depth: int) -> Nest:
    """The guest's nest inside the host's loops 0..depth: those loops as expressions of the
    guest's dims, then the guest's own loops over the dims they leave free."""
    g = state.statement(guest)
    original = state.nest(guest)
    if [v.name for v in original.loops] != dim_names(g) or any(
        v.expr != v.name for v in original.loops
    ):
        raise ScheduleError(f"compute_at: schedule {guest}'s own loops after fusing it, not before")
    for partner in reversed(placed):
        relation = _instances(g, state.statement(partner))
        if relation is None:
            continue
        p = state.statement(partner)
        prefix = time_map(p, state.nest(partner)).project_out(
            isl.dim_type.out, depth + 1, len(state.nest(partner).loops) - depth - 1
        )
        times = relation.apply_range(prefix)
        if not times.is_single_valued():
            raise ScheduleError(
                f"compute_at: {guest} needs several iterations of {host.names()[depth]} at once "
                f"(it reads {partner}'s results across them); fuse at an outer loop"
            )
        exprs = _expressions(times, depth + 1)
        free = [v for v in original.loops if not _determined(times, g, v.name)]
        shared = [Var(host.loops[q].name, exprs[q]) for q in range(depth + 1)]
        return Nest(guest, (*shared, *free))
    raise ScheduleError(
        f"compute_at: {guest} shares no data with the statements of {host.statement}"
    )


def _instances(guest: Statement, other: Statement) -> isl.Map | None:
    """guest instance -> the other statement's instances it exchanges an element with."""
    for ld in loads(guest.expr):
        if ld.access.buffer == other.write.buffer:
            read = named_access(ld.access, "X").intersect_domain(isl.Set(guest.domain))
            write = named_access(other.write, "X").intersect_domain(isl.Set(other.domain))
            return read.apply_range(write.reverse())
    for ld in loads(other.expr):
        if ld.access.buffer == guest.write.buffer:
            write = named_access(guest.write, "X").intersect_domain(isl.Set(guest.domain))
            read = named_access(ld.access, "X").intersect_domain(isl.Set(other.domain))
            return write.apply_range(read.reverse())
    return None


def _expressions(times: isl.Map, count: int) -> list[str]:
    pma = isl.PwMultiAff.from_map(times)
    found = []
    for q in range(count):
        pieces = pma.get_pw_aff(q).get_pieces()
        if len(pieces) != 1:
            raise ScheduleError("compute_at: the alignment is not one affine expression")
        text = str(pieces[0][1])
        found.append(re.search(r"-> \[\((.*)\)\] \}$", text).group(1))
    return found


def _determined(times: isl.Map, stmt: Statement, dim: str) -> bool:
    """Whether the shared loop values fix this dim of the statement."""
    names = dim_names(stmt)
    pos = names.index(dim)
    only = times.reverse().project_out(isl.dim_type.out, pos + 1, len(names) - pos - 1)
    only = only.project_out(isl.dim_type.out, 0, pos)
    return only.is_single_valued()


# ---- storage contraction --------------------------------------------------------------


def inline_fused(state: State, keep: set[str]) -> tuple[State, set[str]]:
    """Substitute fused producers into their consumers where the element written is the
    element read in the same fused iteration; ``keep`` are buffers read elsewhere (other
    kernels, graph outputs). Returns the new state and the buffers that disappeared."""
    dropped: set[str] = set()
    changed = True
    while changed:
        changed = False
        for producer in state.kernel.statements:
            out = producer.write.buffer
            if out in keep or producer.reduce or producer.name not in state.attach:
                continue
            if any(isinstance(e, Iter) for e in _walk(producer.expr)) or gathers(producer.expr):
                continue
            readers = [
                s
                for s in state.kernel.statements
                if any(ld.access.buffer == out for ld in loads(s.expr))
            ]
            writers = [s for s in state.kernel.statements if s.write.buffer == out]
            if len(writers) != 1 or not readers:
                continue
            if not all(_same_iteration(state, producer, r) for r in readers):
                continue
            state = _substitute(state, producer, readers)
            dropped.add(out)
            changed = True
            break
    return state, dropped


def _walk(expr: Expr):
    yield expr
    for child in children(expr):
        yield from _walk(child)


def _same_iteration(state: State, producer: Statement, reader: Statement) -> bool:
    if state.attach.get(reader.name, (None,))[0] != state.attach[producer.name][0]:
        return False
    order = [s.name for s in state.kernel.statements]
    if order.index(reader.name) < order.index(producer.name) or reader.reduce:
        return False
    relation = _instances(reader, producer)
    return relation is not None and relation.is_single_valued() and relation.is_injective()


def _substitute(state: State, producer: Statement, readers: list[Statement]) -> State:
    statements = []
    for stmt in state.kernel.statements:
        if stmt.name == producer.name:
            continue
        if stmt in readers:
            stmt = dataclasses.replace(stmt, expr=_inlined(stmt, producer))
        statements.append(stmt)
    kernel = Kernel(state.kernel.name, state.kernel.op_type, tuple(statements))
    nests = tuple(n for n in state.nests if n.statement != producer.name)
    attach = {k: v for k, v in state.attach.items() if k != producer.name}
    return dataclasses.replace(state, kernel=kernel, nests=nests, attach=attach)


def _inlined(reader: Statement, producer: Statement) -> Expr:
    to_producer = _instances(reader, producer)

    def rewrite(ld: Load) -> Expr:
        if ld.access.buffer != producer.write.buffer:
            return ld
        return map_loads(producer.expr, lambda inner: _through(inner, to_producer, reader))

    return map_loads(reader.expr, rewrite)


def _through(ld: Load, to_producer: isl.Map, reader: Statement) -> Load:
    """The producer's load, seen from the reader's domain."""
    index = isl.Map.from_multi_aff(parse_access(ld.access.index))
    seen = isl.PwMultiAff.from_map(to_producer.apply_range(index))
    if seen.n_piece() != 1:
        raise ScheduleError(f"cannot inline into {reader.name}: not one affine access")
    multi = visit(seen, "foreach_piece")[0][1]
    return dataclasses.replace(ld, access=Access(ld.access.buffer, _anonymous_range(str(multi))))


def _anonymous_range(text: str) -> str:
    return re.sub(r"-> \w+\[", "-> [", text)
