"""``polyonnx.load``: a model as a Program of kernels whose schedules a user can script.

    prog = polyonnx.load("model.onnx")
    s = prog.schedule("mm")            # the Schedule of one kernel (ONNX node name)
    ...                                # split / reorder / vectorize / unroll / parallel
    sess = polyonnx.InferenceSession(prog)
    prog2 = polyonnx.load("model.onnx"); prog2.apply(s.trace)   # replay

Kernels nobody scheduled keep the default heuristic schedule.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import onnx

from polyonnx.errors import ArgumentError, ModelError, ScheduleError, describe
from polyonnx.frontend.graph import Graph
from polyonnx.frontend.limits import Limits
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.ir import Kernel
from polyonnx.krnl.ir import Program as Lowered
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.runtime import arguments
from polyonnx.runtime.compiled import optimize
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.primitives import fuse
from polyonnx.schedule.schedule import REPLAY, Schedule, step_call, step_kernel, trace_steps
from polyonnx.schedule.tree import KernelSchedule


class Program:
    def __init__(self, graph: Graph, lowered: Lowered):
        self.graph = graph
        self.lowered = lowered
        self._schedules: dict[str, Schedule] = {}

    @property
    def kernels(self) -> dict[str, Kernel]:
        return {k.name: k for k in self.lowered.kernels}

    def schedule(self, *names: str) -> Schedule:
        """The Schedule of kernel ``name`` (created on first use, from the original loop
        order), or with several names, one Schedule over those consecutive kernels, whose
        statements ``compute_at`` can then fuse."""
        if not names or not all(isinstance(n, str) for n in names):
            raise ScheduleError(f"schedule() takes kernel names (str), given {names!r:.200}")
        key = "+".join(names)
        if key not in self._schedules:
            order = [k.name for k in self.lowered.kernels]
            unknown = [n for n in names if n not in order]
            if unknown:
                raise ScheduleError(
                    f"no kernel named {unknown[0]!r}; kernels are: {', '.join(order)}"
                )
            taken = [n for n in names if any(n in g.split("+") for g in self._schedules)]
            if taken:
                raise ScheduleError(f"kernel {taken[0]!r} already has a schedule of its own")
            positions = [order.index(n) for n in names]
            if positions != list(range(positions[0], positions[0] + len(names))):
                raise ScheduleError(
                    f"schedule({', '.join(map(repr, names))}): fused kernels must run one after "
                    f"another; the order is {', '.join(order)}"
                )
            kernels = [self.kernels[n] for n in names]
            kernel = kernels[0] if len(kernels) == 1 else fuse.merge(kernels)
            self._schedules[key] = Schedule(kernel, self.lowered.buffers)
        return self._schedules[key]

    def apply(self, trace: Sequence[Mapping[str, Any]]) -> None:
        """Replay trace steps (each names its kernel, or kernels joined by '+'); a
        malformed step raises ScheduleError naming it (the steps before it stay applied)."""
        for position, step in enumerate(trace_steps(trace)):
            names = step_kernel(step, position)
            primitive, args = step_call(step, position)
            schedule = self.schedule(*names)
            REPLAY[primitive].call(schedule, args, f"trace step {position} ({primitive})")

    @property
    def trace(self) -> list[dict[str, Any]]:
        return [step for s in self._schedules.values() for step in s.trace]

    def kernel_schedules(self) -> list[KernelSchedule]:
        return self.compilable()[1]

    def compilable(self) -> tuple[Lowered, list[KernelSchedule]]:
        """The program to compile: fused kernels replaced by their group kernel (with the
        buffers fusion made needless removed) and scripted schedules where there are some;
        elsewhere the default pipeline, as without a script: chains of elementwise kernels
        fuse, so do epilogues into contractions (never into or out of a scripted kernel),
        and each kernel gets its default schedule."""
        groups = {n: key for key in self._schedules for n in key.split("+")}
        kernels, scripted, dropped, scratch = [], {}, set(), {}
        for kernel in self.lowered.kernels:
            key = groups.get(kernel.name)
            if key is None:
                kernels.append(kernel)
                continue
            if key.split("+")[0] != kernel.name:
                continue  # a later member of a group: the group stands at its first member
            state = self._schedules[key].state
            scratch.update(state.scratch)
            if "+" in key:
                state, gone = fuse.inline_fused(state, self._read_outside(key))
                dropped |= gone
            kernels.append(state.kernel)
            scripted[state.kernel.name] = state.to_kernel_schedule()
        buffers = {n: b for n, b in self.lowered.buffers.items() if n not in dropped}
        buffers.update(scratch)
        lowered = dataclasses.replace(
            self.lowered, kernels=tuple(kernels), buffers=MappingProxyType(buffers)
        )
        lowered = optimize(lowered, frozenset(scripted))
        schedules = [
            scripted.get(k.name) or default_schedule(k, lowered.buffers) for k in lowered.kernels
        ]
        return lowered, schedules

    def _read_outside(self, key: str) -> set[str]:
        """Buffers that something outside group ``key`` reads, or that the graph outputs."""
        members = set(key.split("+"))
        outside = {b for k in self.lowered.kernels if k.name not in members for b in k.reads()}
        return (
            outside
            | {self.lowered.root(o) for o in self.lowered.outputs}
            | set(self.lowered.outputs)
        )


def load(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    limits: Limits | None = None,
) -> Program:
    """Load and lower a model (symbolic input dims need ``input_shapes``: input name ->
    dims; ``limits``: the size budget, docs/limits.md). A bad model raises ModelError, bad
    ``input_shapes`` InputError."""
    if isinstance(model, Program):
        raise ModelError("polyonnx.load takes an ONNX model, and this is a loaded Program")
    arguments.model_argument(model)
    shapes = arguments.input_shapes(input_shapes)
    if limits is not None and not isinstance(limits, Limits):
        raise ArgumentError(f"limits must be a Limits (docs/limits.md), given {describe(limits)}")
    graph = load_graph(model, supported_ops=supported_ops(), input_shapes=shapes, limits=limits)
    if not graph.is_static:
        return _parametric(model, graph, shapes, limits)
    return Program(graph, lower(graph))


def _parametric(model, graph: Graph, shapes, limits) -> ParametricProgram:
    """The program of a model whose symbolic dims are isl parameters; ScheduleError
    saying why where there is none."""
    from polyonnx.krnl.params import NotParametric
    from polyonnx.runtime.parametric import fit_parametric, graph_at

    def load_at(shapes):
        return load_graph(model, merge=False, supported_ops=supported_ops(),
                          input_shapes=shapes, limits=limits)  # fmt: skip

    symbols = list(dict.fromkeys(d for v in graph.inputs for d in v.shape if isinstance(d, str)))
    try:
        fitted = fit_parametric(symbols, graph_at(graph.inputs, load_at))
    except NotParametric as exc:
        dynamic = {v.name: list(v.shape) for v in graph.inputs if not v.is_static}
        raise ScheduleError(
            f"inputs with symbolic dims need input_shapes: {dynamic} (not parametric: {exc})"
        ) from exc
    return ParametricProgram(graph, fitted)


class ParametricProgram(Program):
    """A model whose symbolic dims are isl parameters (runtime/parametric.py): its
    kernels are the parametric ones, and a schedule of one is legal for every value.
    Kernels run alone (no compute_at across kernels) and are not repacked; a kernel
    nobody scheduled gets the parametric default."""

    def __init__(self, graph: Graph, fitted):
        super().__init__(graph, fitted.program)
        self.fitted = fitted

    def schedule(self, *names: str) -> Schedule:
        if len(names) > 1:
            raise ScheduleError(
                f"schedule({', '.join(map(repr, names))}): the kernels of a parametric program "
                "are scheduled one at a time"
            )
        return super().schedule(*names)

    def compilable(self) -> tuple[Lowered, list[KernelSchedule]]:
        """The fitted program and each kernel's schedule: the script's, else the
        parametric default."""
        defaults = self.fitted.default_schedules()
        schedules = []
        for kernel, default in zip(self.lowered.kernels, defaults, strict=True):
            scripted = self._schedules.get(kernel.name)
            if scripted is not None and scripted.state.scratch:
                raise ScheduleError(
                    f"kernel {kernel.name!r}: pack() makes a scratch buffer, which a "
                    "parametric program cannot size"
                )
            schedules.append(default if scripted is None else scripted.state.to_kernel_schedule())
        return self.lowered, schedules
