"""The default schedule of a parametric kernel (krnl/params.py), proved legal for every
value of its parameters.

Heuristics choose from sizes, so they run on the kernel as lowered at the last two sample
points (krnl/params.py's CHECKS, sizes a model meets). Where both choose the same loop
nests, fusions and marks, that schedule is moved onto the parametric kernel: a schedule
names loops and dims, not sizes. A contraction run by the micro-kernel keeps its mark,
with its geometry fitted over all the sample points (schedule/gemm.py's FittedGemm): its
row count and outer strides may be polynomials, read at run time. Its parameters are the
default ones for ``REPRESENTATIVE_ROWS`` rows.

Where the two choices differ, each statement gets the loop nest the default heuristic
gives it (a merged loop only where its coefficients do not depend on a size), innermost
in SIMD lanes with a masked run-time remainder.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence

from polyonnx.errors import PolyonnxError, ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel
from polyonnx.krnl.islutil import dim_names, extents
from polyonnx.krnl.params import Fit, Poly
from polyonnx.schedule.deps import check_legal, dependences
from polyonnx.schedule.gemm import FittedGemm, Geometry, Params, geometry, is_ukernel_mark
from polyonnx.schedule.gemm_epilogue import epilogue_loads
from polyonnx.schedule.heuristics.default import (
    PARALLEL_POINTS,
    default_schedule,
    nests_state,
    work,
)
from polyonnx.schedule.heuristics.gemm_defaults import default_params
from polyonnx.schedule.heuristics.nest import loop_nest
from polyonnx.schedule.heuristics.ukernel import with_ukernel
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.state import PARALLEL, State
from polyonnx.schedule.tree import VECTORIZE, KernelSchedule, LoopNest
from polyonnx.target import host_target

REPRESENTATIVE_ROWS = 128
"""The row count whose default micro-kernel parameters a parametric GEMM takes."""

Sample = tuple[Kernel, Mapping[str, Buffer]]


def parametric_schedule(kernel: Kernel, samples: Sequence[Sample], fit: Fit) -> KernelSchedule:
    """``kernel``'s schedule, from ``samples``: the same kernel lowered at each of
    ``fit.points``, with those sizes' buffers. Raises ScheduleError if the schedule
    breaks a dependence for some value of the parameters."""
    moved = _moved(kernel, samples, fit)
    if moved is not None:
        return moved
    plans = [
        _nest([(k.statements[position], b) for k, b in samples[-2:]])
        for position in range(len(kernel.statements))
    ]
    state = nests_state(kernel, plans)
    deps = dependences(kernel)
    state = _threaded(state, deps, samples[-1][0])
    schedule = state.to_kernel_schedule()
    check_legal(schedule, deps)
    return schedule


def _threaded(state: State, deps, sample: Kernel) -> State:
    """Each statement's outermost loop on threads where that is legal and the statement
    has PARALLEL_POINTS of work at the last sample point."""
    for nest, stmt in zip(state.nests, sample.statements, strict=True):
        sizes = dict(zip(dim_names(stmt), extents(stmt), strict=True))
        wide = [v.name for v in nest.loops if sizes.get(v.expr, 2) >= 2]
        if not wide or work(stmt) < PARALLEL_POINTS:
            continue
        first = wide[0]
        if state.marked(first, VECTORIZE):
            continue
        with contextlib.suppress(ScheduleError):
            state = annotate.parallel(state, deps, first)
    return state


def _nest(samples) -> LoopNest:
    plans = {loop_nest(stmt, buffers) for stmt, buffers in samples}
    if len(plans) == 1:
        return plans.pop()
    plans = {loop_nest(stmt, buffers, coalesce=False) for stmt, buffers in samples}
    if len(plans) == 1:
        return plans.pop()
    return LoopNest(tuple(dim_names(samples[0][0])))


# ---- the default heuristic's schedule, moved ----------------------------------------


def tuned_schedule(
    kernel: Kernel, samples: Sequence[Sample], fit: Fit, chosen: Sequence[State]
) -> KernelSchedule | None:
    """The schedule a tuning record gives the kernel at the last two samples (``chosen``,
    its trace replayed on each), moved onto ``kernel`` with the record's micro-kernel
    parameters; None where the two differ in form or the move does not hold."""
    try:
        return _moved(kernel, samples, fit, chosen)
    except ScheduleError:
        return None


def _moved(
    kernel: Kernel, samples: Sequence[Sample], fit: Fit, chosen: Sequence[State] | None = None
) -> KernelSchedule | None:
    """The default schedule chosen at the last two samples (or ``chosen``: a record's,
    its parameters kept), on ``kernel``; where they differ, a contraction alone in the
    micro-kernel (not for ``chosen``); None where neither can be, or the schedule holds
    what a parametric kernel cannot run."""
    states = chosen or [default_schedule(k, b).state for k, b in samples[-2:]]
    if any(s is None or s.scratch for s in states) or _form(states[0]) != _form(states[1]):
        return None if chosen else _gemm_alone(kernel, samples, fit)
    state = dataclasses.replace(states[1], kernel=kernel)
    gemms = []
    for loop, marks in states[1].marks.items():
        if not marks <= {VECTORIZE, PARALLEL} and not _one_ukernel(marks):
            return None
        for mark in marks:
            if is_ukernel_mark(mark):
                nests = state.nests_with(loop)
                host = next(n.statement for n in nests if n.statement not in state.attach)
                fitted = _any_row(kernel, host, state, samples, fit)
                if fitted is None or (chosen and fitted[2] is not None):
                    return None  # a record's row dim does not fit: not the record's schedule
                state = state if chosen else _marked(fitted[2] or state, host, fitted)
                gemms.append(fitted[0])
    return _legal(state, gemms)


def _gemm_alone(kernel: Kernel, samples: Sequence[Sample], fit: Fit) -> KernelSchedule | None:
    """The kernel's one contraction in the micro-kernel, its other statements in SIMD
    loops (schedule/heuristics/ukernel.py's with_ukernel), where that fits."""
    last, buffers = samples[-1]
    hosts = [s.name for s in last.statements if geometry(s, buffers) is not None]
    if len(hosts) != 1:
        return None
    fitted = _any_row(kernel, hosts[0], None, samples, fit)
    if fitted is None:
        return None
    return _legal(_marked(fitted[2], hosts[0], fitted), [fitted[0]])


def _marked(state: State, host: str, fitted) -> State:
    """``state`` with the ukernel mark over ``host``'s row loop set to the parameters of
    the fitted GEMM (``_parameters``)."""
    geo = fitted[1]
    loop = next(
        v.name for n in state.nests if n.statement == host for v in n.loops
        if v.expr == geo.dims[geo.row]
    )  # fmt: skip
    mark = next(m for m in state.marks[loop] if is_ukernel_mark(m))
    return _remarked(state, loop, mark, _parameters(geo, Params.from_mark(mark)).mark())


def _legal(state: State, gemms) -> KernelSchedule:
    schedule = dataclasses.replace(state.to_kernel_schedule(), gemms=tuple(gemms))
    check_legal(schedule, dependences(state.kernel))
    return schedule


def _form(state: State) -> tuple:
    """What a schedule state chose, its micro-kernel parameters aside."""
    marks = {
        loop: frozenset("ukernel" if is_ukernel_mark(m) else m for m in ms)
        for loop, ms in state.marks.items()
    }
    return (state.nests, tuple(sorted(state.attach.items())), tuple(sorted(marks.items())))


def _one_ukernel(marks: frozenset[str]) -> bool:
    return sum(is_ukernel_mark(m) for m in marks) == 1 and all(
        is_ukernel_mark(m) or m in (VECTORIZE, PARALLEL) for m in marks
    )


def _remarked(state: State, loop: str, old: str, new: str) -> State:
    marks = dict(state.marks)
    marks[loop] = (marks[loop] - {old}) | {new}
    return dataclasses.replace(state, marks=marks)


def _any_row(kernel: Kernel, host: str, state: State, samples: Sequence[Sample], fit: Fit):
    """(fitted GEMM, its geometry at the last sample, None or the state) for the row dim
    that fits and whose rows follow the latest symbol (inputs' leading dims come first:
    a batch before a sequence, and a server's batch is often 1); the default's row dim
    (state None) among equals."""
    found = []
    try:
        default = None if state is None else _fitted_gemm(kernel, host, state, samples, fit)
    except PolyonnxError:
        default = None
    if default is not None:
        found.append((*default, None))
    position = [s.name for s in kernel.statements].index(host)
    for row in range(len(dim_names(samples[-1][0].statements[position]))):
        if default is not None and row == default[1].row:
            continue
        moved = _with_row(kernel, host, samples, row)
        if moved is None:
            continue
        try:
            fitted = _fitted_gemm(kernel, host, moved, samples, fit, row)
        except PolyonnxError:
            continue
        if fitted is not None:
            found.append((*fitted, moved))
    if not found:
        return None
    return max(found, key=lambda f: _latest(f[0].geo.sizes[f[0].geo.row], fit.symbols))


def _latest(size, symbols: Sequence[str]) -> int:
    """The position in ``symbols`` of the last one ``size`` depends on, -1 for none."""
    names = size.symbols if isinstance(size, Poly) else ()
    return max((symbols.index(n) for n in names), default=-1)


def _with_row(kernel: Kernel, host: str, samples: Sequence[Sample], row: int) -> State | None:
    """The micro-kernel state with ``row`` as the row dim, the same at the last two
    samples, on ``kernel``; None where it is not."""
    position = [s.name for s in kernel.statements].index(host)
    states = []
    for sample, buffers in samples[-2:]:
        geo = geometry(sample.statements[position], buffers, row)
        if geo is None:
            return None
        target = host_target()
        params = default_params(geo, target.lanes(4), target.vector_registers)
        state = with_ukernel(State.original(sample), host, geo, params, buffers)
        if state is None:
            return None
        states.append(state)
    if _form(states[0]) != _form(states[1]):
        return None
    return dataclasses.replace(states[1], kernel=kernel)


def _fitted_gemm(
    kernel: Kernel,
    host: str,
    state: State,
    samples: Sequence[Sample],
    fit: Fit,
    row: int | None = None,
) -> tuple[FittedGemm, Geometry] | None:
    """The contraction ``host`` as the micro-kernel sees it, fitted over the samples,
    and as it is at the last; None where more than its rows and outer dims depend on
    the sizes."""
    position = [s.name for s in kernel.statements].index(host)
    geos = [geometry(k.statements[position], b, row) for k, b in samples]
    if any(g is None for g in geos):
        return None
    geo = _fitted_geometry(fit, geos, host)
    if not _runs_parametric(geo):
        return None
    tails = _tails(kernel, host, state)
    found = []
    for (k, b), g in zip(samples, geos, strict=True):
        stmts = {s.name: s for s in k.statements}
        operands = []
        for name in tails:
            table = epilogue_loads(stmts[host], stmts[name], g, b)
            if table is None:
                return None
            operands += [(stmts[name], acc, aff, step) for acc, (aff, step) in table.items()]
        found.append(tuple(operands))
    if any(len(o) != len(found[0]) for o in found):
        return None
    operands = tuple(
        (
            fit.tree([o[i][0] for o in found], f"{host}'s epilogue"),
            fit.tree([o[i][1] for o in found], f"{host}'s epilogue"),
            _fitted_affine(fit, [o[i][2] for o in found], f"{host}'s epilogue"),
            fit.same([o[i][3] for o in found], f"{host}'s epilogue step"),
        )
        for i in range(len(found[0]))
    )
    outer = set(geo.outer)
    for _, _, aff, step in operands:
        if isinstance(step, Poly) or isinstance(aff.const, Poly):
            return None
        strided = outer | {geo.row}
        if any(isinstance(c, Poly) for d, c in enumerate(aff.coeffs) if d not in strided):
            return None
    return FittedGemm(host, geo, operands), geos[-1]


def _fitted_geometry(fit: Fit, geos: Sequence[Geometry], host: str) -> Geometry:
    """The geometries fitted: which dim is which is the same at every sample, and only
    sizes, strides and offsets may follow the parameters."""
    where = f"the GEMM view of {host}"
    first = geos[0]
    for name in ("dims", "row", "cols", "depth", "outer"):
        fit.same([getattr(g, name) for g in geos], f"{where}: its {name}")
    return dataclasses.replace(
        first,
        sizes=fit.tree([g.sizes for g in geos], where, numbers=True),
        a=_fitted_affine(fit, [g.a for g in geos], where),
        b=_fitted_affine(fit, [g.b for g in geos], where),
        c=_fitted_affine(fit, [g.c for g in geos], where),
        constraints=fit.tree([g.constraints for g in geos], where, numbers=True),
    )


def _fitted_affine(fit: Fit, affines: Sequence, where: str):
    fit.same([a.buffer for a in affines], f"{where}: its operands")
    return dataclasses.replace(
        affines[0],
        coeffs=fit.tree([a.coeffs for a in affines], where, numbers=True),
        const=fit.tree([a.const for a in affines], where, numbers=True),
    )


def _tails(kernel: Kernel, host: str, state: State) -> list[str]:
    """The statements the micro-kernel applies in registers: the prologue (the last one
    fused before the host, in kernel order), then the epilogue ones after it."""
    names = [s.name for s in kernel.statements]
    fused = {t for t, (h, _) in state.attach.items() if h == host}
    before = [n for n in names[: names.index(host)] if n in fused]
    after = [n for n in names[names.index(host) + 1 :] if n in fused]
    return before[-1:] + after


def _runs_parametric(geo: Geometry) -> bool:
    """Whether only what emit/ukernel.py reads at run time depends on the parameters:
    the row count, the depth and the columns (each of one dim), the outer dims' sizes,
    the operands' strides along them and along the rows (not B's: B does not move along
    the rows), and B's along its depth."""
    free = {geo.row, *geo.outer}
    single = {
        *(geo.depth if len(geo.depth) == 1 else ()),
        *(geo.cols if len(geo.cols) == 1 else ()),
    }
    if any(isinstance(n, Poly) for d, n in enumerate(geo.sizes) if d not in free | single):
        return False
    outer = set(geo.outer)
    moving = outer | (set(geo.depth) & single)  # B's row stride, of one depth dim
    if any(isinstance(c, Poly) for d, c in enumerate(geo.b.coeffs) if d not in moving):
        return False
    for op, allowed in ((geo.a, free), (geo.b, moving), (geo.c, free)):
        if isinstance(op.const, Poly):
            return False
        if any(isinstance(c, Poly) for d, c in enumerate(op.coeffs) if d not in allowed):
            return False
    return not any(isinstance(x, Poly) for coeffs, c in geo.constraints for x in (*coeffs, c))


def _parameters(geo: Geometry, chosen: Params) -> Params:
    """The default parameters of ``geo`` (the last sample's) for REPRESENTATIVE_ROWS
    rows."""
    sizes = tuple(REPRESENTATIVE_ROWS if d == geo.row else n for d, n in enumerate(geo.sizes))
    host = host_target()
    params = default_params(
        dataclasses.replace(geo, sizes=sizes), host.lanes(4), host.vector_registers
    )
    return params
