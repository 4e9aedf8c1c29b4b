"""The ``ukernel`` schedule: a kernel's one contraction in GEMM order (schedule/gemm.py)
under a ``ukernel`` mark carrying its parameters, with its init and epilogue statements
fused under the mark and the other statements in their default nests; and the schedule
primitive that sets the parameters from a script, checking them."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import fields, replace

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel, Statement
from polyonnx.krnl.islutil import dim_names
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.gemm import Geometry, Params, geometry
from polyonnx.schedule.gemm_epilogue import epilogue_statements, epilogue_var, prologue_statement
from polyonnx.schedule.gemm_taps import b_row_stride, b_taps
from polyonnx.schedule.heuristics.gemm_defaults import (
    PARALLEL_WORK,
    SCRATCH_BYTES,
    default_params,
    scratch_bytes,
    vector_registers,
)
from polyonnx.schedule.heuristics.nest import loop_name, loop_nest
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.primitives.split import is_int
from polyonnx.schedule.state import Nest, State, Var
from polyonnx.schedule.tree import KernelSchedule


def ukernel_schedule(
    kernel: Kernel, buffers: Mapping[str, Buffer], params_for
) -> KernelSchedule | None:
    """The kernel with its one contraction run by the micro-kernel (``params_for(geometry)``
    gives the parameters, None: do not), the other statements in their default nests; None
    when the kernel has no such contraction or the order would break a dependence."""
    found = [(s, geometry(s, buffers)) for s in kernel.statements]
    found = [(s, g) for s, g in found if g is not None]
    if len(found) != 1:
        return None
    stmt, geo = found[0]
    params = params_for(geo)
    if params is None:
        return None
    state = with_ukernel(State.original(kernel), stmt.name, geo, params, buffers)
    if state is None:
        return None
    return _threads_over_batches(state, geo, params).to_kernel_schedule()


def _threads_over_batches(state: State, geo: Geometry, params: Params) -> State:
    """A batch of GEMMs, each too small to split, with enough work in all: the outermost
    batch loop runs on threads (attention's per-head products)."""
    batches = [d for d in geo.outer if geo.sizes[d] >= 2]
    total = geo.m * geo.n * geo.k * math.prod(geo.sizes[d] for d in geo.outer)
    if params.split != "none" or not batches or total < PARALLEL_WORK:
        return state
    with contextlib.suppress(ScheduleError):
        state = annotate.parallel(state, dependences(state.kernel), f"{geo.dims[batches[0]]}_g")
    return state


def ukernel_state(
    state: State,
    buffers: Mapping[str, Buffer],
    given: Mapping[str, object],
    lanes: int,
    registers: int | None = None,
) -> State:
    """The schedule primitive: ``state`` with its contraction run by the micro-kernel with
    the ``given`` parameters (the rest from the default for ``lanes`` and ``registers``,
    by default x86's of that width); ScheduleError saying why not."""
    found = [(s, geometry(s, buffers)) for s in state.kernel.statements]
    found = [(s, g) for s, g in found if g is not None]
    if len(found) != 1:
        raise ScheduleError(
            f"ukernel: kernel {state.kernel.name!r} needs exactly one float32 contraction "
            f"C[.., m, n] += A[.., m, k] * B[.., k, n] with A contiguous along k; it has "
            f"{len(found)}"
        )
    stmt, geo = found[0]
    if state.nest(stmt.name).names() != dim_names(stmt) or state.marks:
        raise ScheduleError(
            f"ukernel: {stmt.name}'s loops were already transformed; ukernel replaces them, "
            f"so apply it first"
        )
    unknown = set(given) - {f.name for f in fields(Params)}
    if unknown:
        raise ScheduleError(f"ukernel: unknown parameters {sorted(unknown)}")
    _check_types(given)
    registers = registers or vector_registers(lanes)
    params = replace(default_params(geo, lanes, registers), **given)
    _check(params, lanes, geo)
    result = with_ukernel(state, stmt.name, geo, params, buffers)
    if result is None:
        raise ScheduleError(f"ukernel: the GEMM order would break a dependence of {stmt.name}")
    return result


def _check_types(given: Mapping[str, object]) -> None:
    """Each given parameter of the type its field has (an int, not a bool; split a str)."""
    for name, value in given.items():
        wanted = str if name == "split" else int
        if not (isinstance(value, str) if wanted is str else is_int(value)):
            raise ScheduleError(
                f"ukernel: {name} must be {'a str' if wanted is str else 'an int'}, given "
                f"{type(value).__name__} {value!r:.80}"
            )
        if wanted is int and not 0 <= value <= MAX_PARAM:
            raise ScheduleError(f"ukernel: {name}={value} is out of range 0..{MAX_PARAM}")


MAX_PARAM = 1 << 20
"""No ukernel parameter is larger (a block of 1M rows or columns is far past any cache)."""


def _check(params: Params, lanes: int, geo: Geometry) -> None:
    problems = []
    if params.nr % lanes or params.nr <= 0:
        problems.append(f"nr={params.nr} must be a positive multiple of the SIMD width {lanes}")
    if params.packa not in (0, 1):
        problems.append(f"packa={params.packa} must be 0 or 1")
    if params.prefetch not in (0, 1):
        problems.append(f"prefetch={params.prefetch} must be 0 or 1")
    if params.packb not in (0, 1):
        problems.append(f"packb={params.packb} must be 0 or 1")
    elif params.packb == 0 and b_row_stride(geo) is None:
        taps = b_taps(geo)
        if taps is None:
            problems.append(
                "packb=0 needs B contiguous along the columns and evenly strided along k "
                "(a 1x1 convolution or a MatMul), or a padded stride-1 Conv whose output "
                "rows are as long as its input rows"
            )
        elif params.kc % taps.count:
            problems.append(
                f"kc={params.kc}: reading a Conv's input in place (packb=0) takes whole "
                f"windows, so kc must be a multiple of the {taps.count} taps per channel"
            )
    if scratch_bytes(params) > SCRATCH_BYTES:
        problems.append(
            f"kc={params.kc}, nc={params.nc}, mc={params.mc}: the packed blocks "
            f"({scratch_bytes(params) >> 10} KB) must fit in {SCRATCH_BYTES >> 20} MB of stack"
        )
    for name in ("mr", "kc", "mc", "nc", "unroll"):
        if getattr(params, name) < 1:
            problems.append(f"{name}={getattr(params, name)} must be at least 1")
    if params.mr > 16:
        problems.append(f"mr={params.mr}: at most 16 rows of accumulators")
    if params.split not in ("none", "rows", "cols"):
        problems.append(f"split={params.split!r} must be 'none', 'rows' or 'cols'")
    if problems:
        raise ScheduleError("ukernel: " + "; ".join(problems))


def with_ukernel(
    state: State, statement: str, geo: Geometry, params: Params, buffers: Mapping[str, Buffer]
) -> State | None:
    """``state`` with ``statement`` in micro-kernel order and marked (None if illegal);
    epilogue statements (module docstring of krnl/epilogue.py) that the micro-kernel can
    apply in registers are fused under the mark, the other statements run as SIMD loops."""
    order = [*geo.outer, geo.row, *geo.cols, *geo.depth]
    loops = tuple(Var(f"{geo.dims[d]}_g", geo.dims[d]) for d in order)
    state = state.with_nests(
        tuple(Nest(statement, loops) if n.statement == statement else n for n in state.nests)
    )
    host = state.statement(statement)
    shared = len(geo.outer) + 1 + len(geo.cols)
    fused = epilogue_statements(state.kernel, host, geo, buffers)
    init = prologue_statement(state.kernel, host, geo, buffers)
    for tail in [init] * (init is not None) + fused:
        nest = Nest(tail.name, tuple(epilogue_var(host, tail, v) for v in loops[:shared]))
        state = state.with_attach(tail.name, statement, shared - 1, nest)
    deps = dependences(state.kernel)
    if broken_order(state, deps) is not None:
        return None
    for nest in state.nests:  # the other statements (the init) run as SIMD loops
        if nest.statement in state.attach or nest.statement == statement:
            continue
        state = _default_loops(state, deps, state.statement(nest.statement), buffers)
    return state.with_mark(loops[len(geo.outer)].name, params.mark())


def _default_loops(state: State, deps, stmt: Statement, buffers) -> State:
    """``stmt`` in its default loop nest (coalesced, innermost in SIMD) where legal."""
    plan = loop_nest(stmt, buffers)
    if not plan.order:
        return state
    loops = tuple(Var(loop_name(e), e) for e in plan.order)
    moved = state.with_nests(
        tuple(Nest(stmt.name, loops) if n.statement == stmt.name else n for n in state.nests)
    )
    if broken_order(moved, deps) is not None:
        return state
    if plan.vectorize:
        with contextlib.suppress(ScheduleError):
            moved = annotate.vectorize(moved, deps, loops[-1].name)
    return moved
