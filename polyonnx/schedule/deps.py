"""Memory-based dependences of a kernel, and the legality of a schedule against them.

Two statement instances depend on each other when they touch the same buffer element,
at least one of them writes it, and the kernel's original order runs one first. A
schedule is legal when it keeps every such pair in its original order.
"""

from __future__ import annotations

from functools import lru_cache

import islpy as isl

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Kernel, gathers, loads
from polyonnx.krnl.islutil import dim_names, named_access, parse_set
from polyonnx.schedule.tree import KernelSchedule, LoopNest, sequence_tree


def original_schedule(kernel: Kernel) -> KernelSchedule:
    """Statements in order, each over its dims in declaration order."""
    return sequence_tree(kernel, [LoopNest(tuple(dim_names(s))) for s in kernel.statements])


def access_relations(kernel: Kernel) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(reads, writes) as union maps from statement instances to named buffer elements.
    A reduction's update reads the element it writes; a computed-index read (LoadAt) may
    read any element of its buffer."""
    ids = {name: f"B{i}" for i, name in enumerate(kernel.buffers())}
    space = parse_set(kernel.statements[0].domain).get_space().params()
    reads, writes = isl.UnionMap.empty(space), isl.UnionMap.empty(space)
    for stmt in kernel.statements:
        domain = parse_set(stmt.domain)
        write = named_access(stmt.write, ids[stmt.write.buffer]).intersect_domain(domain)
        writes = writes.union(isl.UnionMap.from_map(write))
        if stmt.reduce is not None:
            reads = reads.union(isl.UnionMap.from_map(write))
        for load in loads(stmt.expr):
            read = named_access(load.access, ids[load.access.buffer]).intersect_domain(domain)
            reads = reads.union(isl.UnionMap.from_map(read))
        for gather in gathers(stmt.expr):  # a computed index may read any element
            whole = _any_element(ids[gather.buffer], len(gather.index))
            reads = reads.union(isl.UnionMap.from_map(isl.Map.from_domain_and_range(domain, whole)))
    return reads, writes


def _any_element(buffer_id: str, rank: int) -> isl.Set:
    return isl.Set(f"{{ {buffer_id}[{', '.join(f'o{r}' for r in range(rank))}] }}")


def dependences(kernel: Kernel, order: isl.UnionMap | None = None) -> isl.UnionMap:
    """Every (earlier → later) pair of instances that conflict on a buffer element, in the
    kernel's original order, or in ``order`` (a schedule map defining the semantics, as
    after a pack, whose scratch buffer is refilled per tile)."""
    if order is None:
        return _in_original_order(kernel)
    return _dependences(kernel, order)


@lru_cache(maxsize=16)
def _in_original_order(kernel: Kernel) -> isl.UnionMap:
    """:func:`dependences` in the original order, kept for the next few kernels: a default
    schedule asks for them more than once (row fusion, then threads), and for a Winograd
    Conv's transform kernels each time took a tenth of a second."""
    return _dependences(kernel, None)


def _dependences(kernel: Kernel, order: isl.UnionMap | None) -> isl.UnionMap:
    reads, writes = access_relations(kernel)
    conflicts = (
        writes.apply_range(writes.reverse())
        .union(writes.apply_range(reads.reverse()))
        .union(reads.apply_range(writes.reverse()))
    )
    if order is None:
        order = original_schedule(kernel).isl_schedule().get_map()
    return conflicts.intersect(order.lex_lt_union_map(order))


def violations(schedule: KernelSchedule, deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences that ``schedule`` runs out of order (or at the same time)."""
    times = schedule.isl_schedule().get_map()
    return deps.intersect(times.lex_ge_union_map(times))


def check_legal(schedule: KernelSchedule, deps: isl.UnionMap | None = None) -> None:
    """Raise ScheduleError naming one pair of iterations that ``schedule`` would reorder."""
    deps = dependences(schedule.kernel) if deps is None else deps
    bad = violations(schedule, deps)
    if bad.is_empty():
        return
    pair = bad
    raise ScheduleError(
        f"kernel {schedule.kernel.name!r}: the schedule breaks a dependence: "
        f"{describe_pair(pair)} must run in its original order"
    )


def describe_pair(pairs: isl.Map | isl.BasicMap | isl.UnionMap) -> str:
    """``S0[i=0, j=1] before S1[i=0, j=1, k=0]``: the lexicographically first pair of a
    (non-empty) dependence relation, so the example is stable and as small as it gets."""
    if isinstance(pairs, isl.UnionMap):
        pairs = pairs.sample()
    pair = isl.Map.from_basic_map(pairs) if isinstance(pairs, isl.BasicMap) else pairs
    point = pair.wrap().lexmin().sample_point()
    n_in, n_out = pair.dim(isl.dim_type.in_), pair.dim(isl.dim_type.out)
    coords = [
        int(point.get_coordinate_val(isl.dim_type.set, d).to_python()) for d in range(n_in + n_out)
    ]
    return (
        f"{_point(pair, isl.dim_type.in_, coords[:n_in])} before "
        f"{_point(pair, isl.dim_type.out, coords[n_in:])}"
    )


def _point(pair: isl.BasicMap, kind: isl.dim_type, values: list[int]) -> str:
    names = [pair.get_dim_name(kind, d) or f"d{d}" for d in range(len(values))]
    inner = ", ".join(f"{n}={v}" for n, v in zip(names, values, strict=True))
    return f"{pair.get_tuple_name(kind)}[{inner}]"
