"""Default schedule for depthwise convolutions (one input channel per group): the window
taps go inside a block of the output row, so each block's sum stays in registers.

A depthwise Conv's update ``Y[n, g*M + m, o0, o1] += X[n, g, s*o0 + k0 - p, s*o1 + k1 - p]
* W[g*M + m, 0, k0, k1]`` reduces over the window only (the input-channel dim ``c`` has
one value). Neither register blocking (no dim along which the vector operand is reused)
nor the stencil order (taps outside the row: every output row is loaded and stored once
per tap) suits it. Here the init is fused into the update and the statement becomes

    for n / for g / for m / for o0 / for o1_o
        Y[.., o0, B*o1_o + o1_i] = bias                       (SIMD o1_i: the init)
        for c / for k0 (unrolled) / for k1 (unrolled)
            for o1_i (SIMD)              o1_i's bounds depend on k1 only at the row's ends
                Y[.., o0, B*o1_o + o1_i] += X[.., s*o0 + k0 - p, s*(B*o1_o + o1_i) + k1 - p] * W[..]

so, inside the row, one block of B outputs is initialised, takes its 9 taps and is
stored once: LLVM keeps it in a register (the unrolled taps are straight-line code over
the same addresses). Padding stays exact: a tap outside the input is not in the domain.

    before:  for g, o0 / for k0 / for k1 / SIMD for o1 = lo(k1)..hi(k1)
    after:   for g, o0, o1_o / init / for k0, k1 (unrolled) / SIMD for o1_i
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Binary, Buffer, Cast, Kernel, Load, Statement, loads
from polyonnx.krnl.islutil import (
    dim_names,
    extents,
    flat_stride,
    named_access,
    parse_access,
    parse_set,
    tuple_names,
)
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.primitives.split import fresh
from polyonnx.schedule.state import Nest, State, Var, time_map
from polyonnx.schedule.tree import KernelSchedule

ROW_VECTORS = 4
"""Output rows of at least this many vectors (64 floats on AVX-512) take this schedule;
stride-2 rows from one vector: narrower stride-1 rows got slower, every block an edge
block (docs/measurements.md, 'Depthwise row blocks')."""
PARALLEL_POINTS = 1 << 20
"""As schedule/heuristics/default.py's: update instances from which the outermost loop runs on
threads."""
MAX_TAPS = 49
"""Window points (7 x 7) up to which the taps are unrolled inside the row block."""


@dataclass(frozen=True)
class Plan:
    """The update's dims: ``outer`` (batch, channel, output rows), the ``row`` along which Y
    is contiguous, the ``taps`` (window dims, and the one-valued input channel)."""

    update: str
    outer: list[str]
    row: str
    taps: list[str]
    row_extent: int
    row_step: int
    """How far the input moves along the row: the stride."""


def depthwise_schedule(
    kernel: Kernel, buffers: Mapping[str, Buffer], lanes: int
) -> KernelSchedule | None:
    """The taps-inside-a-row-block schedule of a depthwise convolution kernel, or None."""
    plans = [p for p in (_plan(s, buffers) for s in kernel.statements) if p is not None]
    if len(plans) != 1:
        return None
    plan = plans[0]
    if not _worth_it(plan, lanes):
        return None
    state = _ordered(State.original(kernel), plan, lanes)
    deps = dependences(kernel)
    if broken_order(state, deps) is not None:
        return None
    try:
        for tap in plan.taps:
            state = annotate.unroll(state, tap)
        state = annotate.vectorize(state, deps, _inner(state, plan))
    except ScheduleError:  # any refusal means: keep the other defaults
        return None
    update = state.statement(plan.update)
    threads = math.prod(extents(update)) >= PARALLEL_POINTS
    if threads:
        wide = [d for d, n in zip(dim_names(update), extents(update), strict=True) if n > 1]
        first = next((d for d in plan.outer if d in wide), None)
        if first is not None:
            with contextlib.suppress(ScheduleError):
                state = annotate.parallel(state, deps, first)
    state = _own_nests(state, deps, plan, threads)
    return KernelSchedule(kernel, str(_isolated(state, plan)), state)


def _own_nests(state: State, deps, plan: Plan, threads: bool) -> State:
    """The statements in nests of their own (a padded copy of the input): SIMD along
    their innermost loop, and with the update on threads, their outermost wide loop too."""
    for nest in state.nests:
        if nest.statement == plan.update or nest.statement in state.attach:
            continue
        stmt = state.statement(nest.statement)
        with contextlib.suppress(ScheduleError):
            state = annotate.vectorize(state, deps, nest.names()[-1])
        wide = [d for d, n in zip(nest.names(), extents(stmt), strict=True) if n > 1]
        if threads and len(wide) > 1:
            with contextlib.suppress(ScheduleError):
                state = annotate.parallel(state, deps, wide[0])
    return state


def _worth_it(plan: Plan, lanes: int) -> bool:
    """Rows of at least ROW_VECTORS vectors, or strided rows of a vector or more: measured
    faster than the stencil order. Shorter rows are mostly edge blocks, which run scalar."""
    if plan.row_extent >= ROW_VECTORS * lanes:
        return True
    return plan.row_step > 1 and plan.row_extent >= lanes


def _isolated(state: State, plan: Plan) -> isl.Schedule:
    """The state's tree with the full blocks isolated: where every tap of a row block is
    in the domain (inside the padding), isl generates the block with constant bounds, so
    it is straight-line vector code; the other (edge) blocks have their row loop unrolled
    into scalar code, which LLVM keeps in registers too (masked vector tails there would
    store and reload partial vectors between taps)."""
    update = state.statement(plan.update)
    nest = state.nest(plan.update)
    depth = len(plan.outer)
    count = len(nest.loops)
    times = time_map(update, nest).range()
    prefix = times.project_out(isl.dim_type.set, depth + 1, count - depth - 1)
    inner = [f"t{d}" for d in range(count)]
    low, high = times.dim_min_val, times.dim_max_val
    bounds = " and ".join(
        f"{low(d).to_python()} <= t{d} <= {high(d).to_python()}" for d in range(depth + 1, count)
    )
    box = isl.Set(f"{{ [{', '.join(inner)}] : {bounds} }}").intersect(
        prefix.insert_dims(isl.dim_type.set, depth + 1, count - depth - 1)
    )
    partial = box.subtract(times).project_out(isl.dim_type.set, depth + 1, count - depth - 1)
    full = prefix.subtract(partial).coalesce()
    node = _with_options(state.isl_schedule().get_root(), full, 0, plan.update)
    return node.get_schedule()


def _with_options(
    node: isl.ScheduleNode, full: isl.Set, outer: int, update: str
) -> isl.ScheduleNode:
    """Set the isolate options below ``node`` (``outer`` band members above it), on the
    update's loops only (not on those of statements in other nests: a padded copy)."""
    size = full.dim(isl.dim_type.set)
    kind = node.get_type()
    if kind == isl.schedule_node_type.filter and update not in tuple_names(
        node.filter_get_filter()
    ):
        return node
    if kind == isl.schedule_node_type.band:
        members = node.band_n_member()
        options = None
        if outer < size <= outer + members:  # the band that ends the row block's prefix
            options = _isolate(full, outer, members)
        elif outer >= size and node.get_child(0).get_type() == isl.schedule_node_type.leaf:
            extended = full.insert_dims(isl.dim_type.set, size, outer + members - size)
            options = _isolate(extended, outer, members).union(isl.UnionSet("{ unroll[x] }"))
        if options is not None:
            node = node.band_set_ast_build_options(options)
        outer += members
    for index in range(node.n_children()):
        node = _with_options(node.child(index), full, outer, update).parent()
    return node


def _isolate(full: isl.Set, outer: int, members: int) -> isl.UnionSet:
    """``{ isolate[[outer dims] -> [band dims]] : full }``."""
    size = full.dim(isl.dim_type.set)
    if size < outer + members:
        full = full.insert_dims(isl.dim_type.set, size, outer + members - size)
    relation = isl.Map.from_range(full).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, outer)
    return isl.UnionSet.from_set(relation.wrap().set_tuple_name("isolate"))


def _inner(state: State, plan: Plan) -> str:
    return state.nest(plan.update).names()[-1]


def _ordered(state: State, plan: Plan, block: int) -> State:
    """The update as ``outer, row_o, taps, row_i``; every other statement that touches the
    update's output one element per instance (the init, an epilogue) fused at ``row_o``,
    over ``row_i`` inside it. A statement that cannot be aligned keeps its own nest."""
    row_o, row_i = fresh(state, f"{plan.row}_o"), fresh(state, f"{plan.row}_i")
    outer_loop = f"floor(({plan.row})/{block})"
    loops = [Var(d, d) for d in plan.outer]
    loops += [Var(row_o, outer_loop)]
    loops += [Var(t, t) for t in plan.taps]
    loops += [Var(row_i, f"({plan.row}) - {block}*{outer_loop}")]
    host = Nest(plan.update, tuple(loops))
    nests = tuple(host if n.statement == plan.update else n for n in state.nests)
    state = state.with_nests(nests)
    depth = len(plan.outer)
    for stmt in state.kernel.statements:
        if stmt.name == plan.update:
            continue
        nest = _aligned(stmt, state.statement(plan.update), host, depth)
        if nest is not None:
            state = state.with_attach(stmt.name, plan.update, depth, nest)
    return state


def _aligned(stmt: Statement, update: Statement, host: Nest, depth: int) -> Nest | None:
    """``stmt``'s nest as the host's loops 0..depth and its last loop, each an expression
    of ``stmt``'s dims through the element of the update's output it writes or reads;
    None when that element is not one affine function of its instance, or when the
    host's loops do not fix every dim of ``stmt``."""
    out = update.write.buffer
    touched = [stmt.write] if stmt.write.buffer == out else []
    touched += [ld.access for ld in loads(stmt.expr) if ld.access.buffer == out]
    if len(touched) != 1 or stmt.reduce is not None:
        return None
    mine = named_access(touched[0], "Y").intersect_domain(parse_set(stmt.domain))
    theirs = named_access(update.write, "Y").intersect_domain(parse_set(update.domain))
    keep = [*range(depth + 1), len(host.loops) - 1]
    times = time_map(update, host)
    for position in reversed(range(len(host.loops))):
        if position not in keep:
            times = times.project_out(isl.dim_type.out, position, 1)
    times = mine.apply_range(theirs.reverse()).apply_range(times)
    if not times.is_single_valued() or not times.is_injective():
        return None
    if not times.domain().is_equal(parse_set(stmt.domain)):
        return None  # an element no tap reaches (all padding): keep its own loops
    pma = isl.PwMultiAff.from_map(times)
    exprs = []
    for q in range(len(keep)):
        pieces = pma.get_pw_aff(q).get_pieces()
        if len(pieces) != 1:
            return None
        exprs.append(re.search(r"-> \[\((.*)\)\] \}$", str(pieces[0][1])).group(1))
    names = [host.loops[p].name for p in keep]
    return Nest(stmt.name, tuple(Var(n, e) for n, e in zip(names, exprs, strict=True)))


def _plan(stmt: Statement, buffers: Mapping[str, Buffer]) -> Plan | None:
    """The update of a depthwise convolution, else None: a sum of a product of two loads
    whose reduction dims all move the input (window taps, and dims of one value), with
    a row along which the output is contiguous and the input moves by the stride."""
    if stmt.reduce != "add" or not isinstance(stmt.expr, Binary) or stmt.expr.op != "mul":
        return None
    operands = [_load(stmt.expr.a), _load(stmt.expr.b)]
    if any(x is None for x in operands):
        return None
    names = dim_names(stmt)
    sizes = extents(stmt)
    shape = buffers[stmt.write.buffer].shape
    writes = [flat_stride(stmt.write, shape, p) for p in range(len(names))]
    if any(s is None for s in writes) or 1 not in writes:
        return None
    row = len(names) - 1 - writes[::-1].index(1)
    steps = [
        [flat_stride(x.access, buffers[x.access.buffer].shape, p) for p in range(len(names))]
        for x in operands
    ]
    moving = [k for k in range(2) if steps[k][row] not in (0, None)]
    if len(moving) != 1 or steps[1 - moving[0]][row] != 0:
        return None
    x = steps[moving[0]]
    reduced = [p for p in range(len(names)) if writes[p] == 0]
    window = [p for p in reduced if sizes[p] > 1]
    if not window or any(x[p] in (0, None) for p in window):
        return None
    weight = steps[1 - moving[0]]
    spatial = [p for p in range(len(names)) if p not in reduced and weight[p] == 0]
    allowed = set().union(*(_axes(operands[moving[0]], p) for p in spatial))
    if any(not _axes(operands[moving[0]], p) <= allowed for p in window):
        return None  # a reduction over channels: a contraction (schedule/heuristics/blocking.py)
    if math.prod(sizes[p] for p in window) > MAX_TAPS:
        return None
    outer = [names[p] for p in range(len(names)) if p != row and p not in reduced]
    taps = [names[p] for p in reduced]
    return Plan(stmt.name, outer, names[row], taps, sizes[row], abs(x[row]))


def _axes(load: Load, dim: int) -> set[int]:
    """The axes of the loaded buffer along which the index moves with domain dim ``dim``."""
    index = parse_access(load.access.index)
    return {
        r
        for r in range(index.dim(isl.dim_type.out))
        if not index.get_aff(r).get_coefficient_val(isl.dim_type.in_, dim).is_zero()
    }


def _load(expr) -> Load | None:
    """A load, or a load under casts (float16 inputs are summed in float32)."""
    while isinstance(expr, Cast):
        expr = expr.x
    return expr if isinstance(expr, Load) else None
