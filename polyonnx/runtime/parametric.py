"""A model compiled once for every value of its symbolic dims: a parametric Program
(krnl/params.py) whose kernels take the parameters' values at run time.

Bounds are proved for every value of the parameters at compile time (krnl/verify.py).
At run time the values are read off the inputs' shapes, every buffer is sized from them,
and the arena is planned for them (runtime/memory.py's packing, once per distinct value).
Each arena tensor has a slot of its own, so the entry's pointers follow the plan.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.aligned import ALIGN, aligned, aligned_empty
from polyonnx.emit.abi import failure
from polyonnx.emit.jit import JitModule
from polyonnx.emit.module import ENTRY, ModulePlan, plan_modules
from polyonnx.emit.objects import compile_objects, gc_paused
from polyonnx.errors import CodegenError, InputError, RunError, ScheduleError
from polyonnx.frontend.graph import Graph
from polyonnx.krnl.ir import Program
from polyonnx.krnl.lower import lower
from polyonnx.krnl.params import (
    Fit,
    NotParametric,
    Point,
    Poly,
    parameter_value,
    program_symbols,
    sample_points,
    shape_at,
)
from polyonnx.krnl.verify import check_bounds
from polyonnx.runtime.compiled import (
    POISON,
    check_table,
    default_schedules,
    optimize,
    set_jit_threads,
)
from polyonnx.runtime.memory import arena_plan, external_slots
from polyonnx.schedule.astgen import INDEX_LIMIT, kernel_parameters
from polyonnx.schedule.heuristics.panels import pack_constants
from polyonnx.schedule.heuristics.parametric import parametric_schedule, tuned_schedule
from polyonnx.schedule.schedule import Schedule
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.target import Target, host_target

RECENT_PLANS = 64
"""Arena plans kept, by parameter values (each is a few microseconds of Python to make)."""


@dataclass(frozen=True)
class Slots:
    """The entry's pointers: the model's inputs, outputs and constants, then one per
    arena tensor (``roots``), then the parameters' values and the error record."""

    external: tuple[str, ...]
    roots: tuple[str, ...]
    places: Mapping[str, tuple[int, int]]

    @property
    def params(self) -> int:
        return len(self.external) + len(self.roots)

    @property
    def errors(self) -> int:
        return self.params + 1


def plan_slots(program: Program) -> Slots:
    """Where each buffer lives, as runtime/memory.py's plan_memory places it, with the
    arena's tensors in slots of their own (their offsets are planned per size)."""
    external, owner = external_slots(program)
    arena = [program.root(n) for n in program.buffers if program.root(n) not in owner]
    roots = tuple(dict.fromkeys(arena))
    for i, root in enumerate(roots):
        owner[root] = len(external) + i
    places = {n: (owner[program.root(n)], program.offset(n)) for n in program.buffers}
    return Slots(tuple(external), roots, places)


def graph_at(inputs, load: Callable[..., Graph]) -> Callable[[Mapping[str, int]], Graph]:
    """``graph_at`` for :func:`compile_parametric`: the graph ``load(shapes=...)`` gives
    with each symbolic dim of ``inputs`` (frontend Values) at the point's value."""

    def at(point: Mapping[str, int]) -> Graph:
        shapes = {
            v.name: tuple(point.get(d, d) if isinstance(d, str) else d for d in v.shape)
            for v in inputs
        }
        return load(shapes=shapes)

    return at


def compile_parametric(
    symbols: Sequence[str],
    graph_at: Callable[[Mapping[str, int]], Graph],
    target: Target | None = None,
    *,
    checks: bool = True,
    records=None,
    point: Point | None = None,
) -> ParametricModel:
    """The model whose graph at given values of ``symbols`` is ``graph_at(point)``,
    compiled once with the symbols as isl parameters (:func:`build_parametric`, which
    takes ``records`` measured at ``point``, for the host only) into native code of this
    process."""
    host = target is None or target == host_target()
    target = target or host_target()
    with gc_paused():
        build = build_parametric(symbols, graph_at, target, checks=checks,
                                 records=records if host else None, point=point)  # fmt: skip
        return jit_parametric(build, target, checks)


def jit_parametric(build: ParametricBuild, target: Target, checks: bool) -> ParametricModel:
    """Native code of ``build`` in this process."""
    plan = build.plan
    objects = compile_objects(plan.entry, plan.jobs, build.program.buffers, target)
    jit = JitModule(objects.objects, target, objects.sources)
    return ParametricModel(
        build.program, build.schedules, build.slots, jit, checks,
        derived=build.derived, tuned=build.tuned,
    )  # fmt: skip


@dataclass(frozen=True)
class ParametricBuild:
    """A parametric Program, its schedules, where its buffers live and its modules."""

    program: Program
    schedules: tuple[KernelSchedule, ...]
    slots: Slots
    plan: ModulePlan
    derived: Derived
    tuned: tuple[str, ...] = ()
    """The kernels that tuning records scheduled."""


@dataclass(frozen=True)
class Fitted:
    """A parametric Program fitted from the graph lowered at ``fit.points`` (``samples``),
    before scheduling; ``derived``: its size-dependent constants."""

    program: Program
    samples: tuple[Program, ...]
    fit: Fit
    derived: Derived

    def pairs(self, i: int) -> list[tuple]:
        """Kernel ``i`` as lowered at each sample point, with that sample's buffers."""
        return [(s.kernels[i], s.buffers) for s in self.samples]

    def default_schedules(self) -> tuple[KernelSchedule, ...]:
        return tuple(
            parametric_schedule(k, self.pairs(i), self.fit)
            for i, k in enumerate(self.program.kernels)
        )


def fit_parametric(
    symbols: Sequence[str], graph_at: Callable[[Mapping[str, int]], Graph]
) -> Fitted:
    """Lower the graph at a few sizes and fit one program with ``symbols`` as isl
    parameters, its accesses proved in bounds for every value; NotParametric where there
    is no such program. The graph's constants computed from the sizes (a causal mask)
    are taken from ``graph_at`` at each new size (``Derived``)."""
    fit = Fit(tuple(symbols), sample_points(symbols))
    graphs = [graph_at(point) for point in fit.points]
    samples = tuple(optimize(lower(graph)) for graph in graphs)
    names: set[str] = set()
    program = fit.program(samples, names)
    derived = _derived(names, samples[-1], graphs[-1].constants, graph_at)
    check_bounds(program)
    return Fitted(program, samples, fit, derived)


def build_parametric(
    symbols: Sequence[str],
    graph_at: Callable[[Mapping[str, int]], Graph],
    target: Target,
    *,
    checks: bool = True,
    records=None,
    point: Point | None = None,
) -> ParametricBuild:
    """The fitted program (:func:`fit_parametric`) scheduled and planned; ScheduleError
    where its nests are not legal for every value. ``records`` (tune/apply.py's Records)
    that beat the default on the graph at ``point`` schedule the kernels they fit
    (``_schedules``)."""
    fitted = fit_parametric(symbols, graph_at)
    tune = records is not None and point and min(point.values()) >= 1
    traces = _traces(records, graph_at(point), target) if tune else {}
    schedules, tuned = _schedules(fitted, traces)
    return plan_parametric(fitted, schedules, target, checks=checks, tuned=tuned)


def plan_parametric(
    fitted: Fitted,
    schedules: Sequence[KernelSchedule],
    target: Target,
    *,
    checks: bool = True,
    tuned: tuple[str, ...] = (),
) -> ParametricBuild:
    """The fitted program's constant GEMM weights packed, its buffers placed in slots
    and its modules planned, under ``schedules``."""
    program, schedules = pack_constants(fitted.program, tuple(schedules), target)
    names = set(fitted.derived.names)
    schedules = tuple(_unpacked(s, program, names) for s in schedules)
    slots = plan_slots(program)
    plan = plan_modules(
        schedules,
        program.buffers,
        slots.places,
        target,
        errors=slots.errors,
        checks=checks,
        params=slots.params,
    )
    return ParametricBuild(program, schedules, slots, plan, fitted.derived, tuned)


def _traces(records, graph: Graph, target: Target) -> dict[str, list]:
    """The traces of the records that beat the default on ``graph``'s kernels, by kernel
    name (the graph at one point: the sizes the records were measured at)."""
    program = optimize(lower(graph))
    _, used = records.schedules(program, default_schedules(program, target))
    return {name: list(trial.trace) for name, trial in used.items()}


def _schedules(fitted: Fitted, traces):
    """Each kernel's parametric schedule: a record's trace, replayed at the last two
    sample points and moved onto the kernel where that holds (tuned_schedule), else the
    default's; and the kernels the records scheduled."""
    schedules, tuned = [], []
    for i, kernel in enumerate(fitted.program.kernels):
        pairs = fitted.pairs(i)
        chosen = _replayed(pairs[-2:], traces.get(kernel.name))
        schedule = chosen and tuned_schedule(kernel, pairs, fitted.fit, chosen)
        if schedule:
            tuned.append(kernel.name)
        schedules.append(schedule or parametric_schedule(kernel, pairs, fitted.fit))
    return tuple(schedules), tuple(tuned)


def _replayed(pairs, trace: list | None) -> list | None:
    """The states ``trace`` gives each (kernel, buffers) of ``pairs``; None where it does
    not apply to one, or adds scratch buffers."""
    if trace is None:
        return None
    states = []
    for kernel, buffers in pairs:
        schedule = Schedule(kernel, buffers)
        try:
            schedule.apply([{**dict(step), "kernel": kernel.name} for step in trace])
        except (ScheduleError, KeyError, TypeError, ValueError):
            return None
        if schedule.state.scratch:
            return None
        states.append(schedule.state)
    return states


@dataclass(frozen=True)
class Derived:
    """Constants whose values depend on the sizes: ``names``, taken from the model's
    graph folded at a point (``graph_at``) once per distinct point."""

    names: tuple[str, ...]
    graph_at: Callable[[Mapping[str, int]], Graph] | None

    def at(self, point: Mapping[str, int]) -> dict[str, np.ndarray]:
        """The constants at ``point``; NotParametric where the graph folded there does not
        give them all (at size 1 a fold may take another path: BERT's sliced position
        ids)."""
        found = self.graph_at(point).constants
        missing = [n for n in self.names if n not in found]
        if missing:
            raise NotParametric(f"at {dict(point)} the graph folds no constant {missing}")
        return {n: aligned(np.asarray(found[n])) for n in self.names}


def _derived(names: set[str], sample: Program, folded: Mapping, graph_at) -> Derived:
    """The size-dependent constants, checked to be the graph's own: the graph's
    ``folded`` constants at the last sample point must be what the lowering used there."""
    if not names:
        return Derived((), None)
    for name in sorted(names):
        given = folded.get(name)
        if given is None or np.asarray(given).tobytes() != sample.constants[name].tobytes():
            raise NotParametric(f"constant {name!r} depends on the sizes")
    return Derived(tuple(sorted(names)), graph_at)


def _unpacked(schedule: KernelSchedule, program: Program, derived: set[str]) -> KernelSchedule:
    """``schedule`` without a panel copy of a size-dependent B (packed at one size)."""
    if any(program.root(b) in derived for b, _ in schedule.panels):
        return dataclasses.replace(schedule, panels=())
    return schedule


def symbol_of(dim) -> str | None:
    """The symbol a dim is, alone (``S``, not ``S - 1`` or ``2*S``), else None."""
    if isinstance(dim, Poly) and len(dim.symbols) == 1:
        (symbol,) = dim.symbols
        return symbol if dim == Poly.symbol(symbol) else None
    return None


def entry_parameters(schedules: Sequence[KernelSchedule]) -> tuple[str, ...]:
    """The isl parameters every parametric kernel takes, in the order of the values its
    code reads (krnl/params.py's ``parameters``: one list for the whole program)."""
    found = {kernel_parameters(s.kernel.statements) for s in schedules} - {()}
    if len(found) > 1:
        raise CodegenError(f"kernels with different parameters: {sorted(found)}")
    return found.pop() if found else ()


class ParametricModel:
    """Native code for a parametric Program. ``run`` takes inputs of any values of the
    symbols (validated by the session: their dtypes, ranks and static dims)."""

    def __init__(
        self,
        program: Program,
        schedules: tuple[KernelSchedule, ...],
        slots: Slots,
        jit: JitModule,
        checks: bool,
        *,
        derived: Derived = Derived((), None),
        tuned: tuple[str, ...] = (),
    ):
        self.program = program
        self.tuned = tuned
        """The kernels whose schedules came from tuning records (build_parametric)."""
        self.schedules = schedules
        self.slots = slots
        self.jit = jit
        self.symbols = program_symbols(program)
        self.parameters = entry_parameters(schedules)
        self.checks = check_table(schedules) if checks else ()
        self._entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(jit.address(ENTRY))
        self._lock = threading.Lock()
        self._plans: dict[tuple, tuple[dict[str, int], int]] = {}
        self._arena = aligned_empty((ALIGN,), np.uint8)
        self._poison = bool(os.environ.get(POISON))
        self._params = np.zeros(max(len(self.parameters), 1), np.int64)
        self._errors = np.zeros(2, np.int64)
        self._pointers = (ctypes.c_void_p * (slots.errors + 1))()
        self._pointers[slots.params] = self._params.ctypes.data
        self._pointers[slots.errors] = self._errors.ctypes.data
        for i, name in enumerate(slots.external):
            if name in program.constants:
                self._pointers[i] = program.constants[name].ctypes.data
        self.derived = derived
        self._derived: dict[tuple, dict[str, np.ndarray]] = {}

    def set_threads(self, count: int) -> None:
        set_jit_threads(self.jit, count)

    def memory(self) -> None:
        """None: the arena is planned per size at run time (``_plan``)."""
        return None

    def point(self, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
        """The symbols' values that the inputs' shapes give; InputError naming the inputs
        whose shapes disagree on one."""
        found: dict[str, tuple[int, str]] = {}
        for name in self.program.inputs:
            dims = self.program.buffers[name].shape
            for dim, size in zip(dims, inputs[name].shape, strict=True):
                symbol = symbol_of(dim)
                if symbol is not None:
                    if symbol in found and found[symbol][0] != size:
                        raise InputError(
                            f"inputs {found[symbol][1]!r} and {name!r} give the symbolic dim "
                            f"{symbol!r} different sizes: {found[symbol][0]} and {size}"
                        )
                    found.setdefault(symbol, (size, name))
        missing = [s for s in self.symbols if s not in found]
        if missing:
            raise InputError(f"no input's shape gives the symbolic dims {missing}")
        point = {s: v for s, (v, _) in found.items()}
        for name in self.program.inputs:
            want = shape_at(self.program.buffers[name].shape, point)
            if tuple(inputs[name].shape) != want:
                raise InputError(
                    f"input {name!r} has shape {list(inputs[name].shape)}; with "
                    f"{point} it must be {list(want)}"
                )
        return point

    def _plan(self, point: Point) -> tuple[dict[str, int], int]:
        """The arena tensors' byte offsets at ``point`` and the arena's size."""
        key = tuple(point[s] for s in self.symbols)
        if key not in self._plans:
            sizes = {}
            for root in self.slots.roots:
                buffer = self.program.buffers[root]
                count = int(np.prod(shape_at(buffer.shape, point), dtype=object))
                if count > INDEX_LIMIT:
                    raise InputError(f"with {dict(point)} tensor {root!r} has {count} elements")
                sizes[root] = count * buffer.itemsize
            if len(self._plans) >= RECENT_PLANS:
                self._plans.clear()
            self._plans[key] = arena_plan(self.program, sizes)
        return self._plans[key]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        point = self.point(inputs)
        offsets, total = self._plan(point)
        derived = self._derived_at(point)
        results: dict[str, np.ndarray] = {}
        with self._lock:
            if self._arena.nbytes < total:
                self._arena = aligned_empty((total,), np.uint8)
            if self._poison:
                self._arena.fill(0xFF)
            pointers = self._pointers
            base = self._arena.ctypes.data
            for i, root in enumerate(self.slots.roots, start=len(self.slots.external)):
                pointers[i] = base + offsets[root]
            for i, name in enumerate(self.slots.external):
                if name in self.program.inputs:
                    pointers[i] = inputs[name].ctypes.data
                elif name not in self.program.constants:
                    results[name] = self._output(name, point)
                    pointers[i] = results[name].ctypes.data
            for i, name in enumerate(self.slots.external):
                if name in derived:
                    pointers[i] = derived[name].ctypes.data
            for k, name in enumerate(self.parameters):
                self._params[k] = parameter_value(name, point)
            self._entry(pointers)
            site, value = int(self._errors[0]), int(self._errors[1])
            self._errors[:] = 0
        if site:
            raise RunError(failure(self.checks, site, value))
        for name in self.program.outputs:
            if name not in results:
                given = inputs.get(name)
                source = given if given is not None else self._constant(name, point)
                results[name] = np.array(source)
        return {name: results[name] for name in self.program.outputs}

    def serves(self, inputs: Mapping[str, np.ndarray]) -> bool:
        """Whether this code runs ``inputs``' sizes: False where the size-dependent
        constants cannot be had there (the session then compiles for the shapes)."""
        try:
            self._derived_at(self.point(inputs))
        except NotParametric:
            return False
        return True

    def _constant(self, name: str, point: Point) -> np.ndarray:
        return self._derived_at(point).get(name, self.program.constants.get(name))

    def _derived_at(self, point: Point) -> dict[str, np.ndarray]:
        """The size-dependent constants at ``point`` (folded once per distinct point)."""
        if not self.derived.names:
            return {}
        key = tuple(point[s] for s in self.symbols)
        if key not in self._derived:
            if len(self._derived) >= RECENT_PLANS:
                self._derived.clear()
            self._derived[key] = self.derived.at(point)
        return self._derived[key]

    def _output(self, name: str, point: Point) -> np.ndarray:
        buffer = self.program.buffers[name]
        array = aligned_empty(shape_at(buffer.shape, point), np.dtype(buffer.dtype))
        if self._poison:
            array.reshape(-1).view(np.uint8).fill(0xFF)
        return array
