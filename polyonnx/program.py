"""``polyonnx.load``: a model as a Program of kernels whose schedules a user can script.

    prog = polyonnx.load("model.onnx")
    s = prog.schedule("mm")            # the Schedule of one kernel (ONNX node name)
    ...                                # split / reorder / vectorize / unroll / parallel
    sess = polyonnx.InferenceSession(prog)
    prog2 = polyonnx.load("model.onnx"); prog2.apply(s.trace)   # replay

Kernels nobody scheduled keep the default heuristic schedule.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from polyonnx.errors import ScheduleError
from polyonnx.frontend.graph import Graph
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.ir import Kernel
from polyonnx.krnl.ir import Program as Lowered
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.schedule.default import default_schedule
from polyonnx.schedule.schedule import Schedule
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
        order). Several names ask for a fused schedule, which is not supported yet."""
        if len(names) != 1:
            raise ScheduleError(
                f"schedule({', '.join(map(repr, names))}): fusing kernels is not supported yet; "
                "schedule one kernel at a time"
            )
        name = names[0]
        if name not in self._schedules:
            kernel = self.kernels.get(name)
            if kernel is None:
                known = ", ".join(self.kernels)
                raise ScheduleError(f"no kernel named {name!r}; kernels are: {known}")
            self._schedules[name] = Schedule(kernel, self.lowered.buffers)
        return self._schedules[name]

    def apply(self, trace: Sequence[Mapping[str, Any]]) -> None:
        """Replay trace steps (each names its kernel) on this program."""
        for step in trace:
            self.schedule(step["kernel"]).apply([step])

    @property
    def trace(self) -> list[dict[str, Any]]:
        return [step for s in self._schedules.values() for step in s.trace]

    def kernel_schedules(self) -> list[KernelSchedule]:
        """Scripted schedules where there are some, default ones elsewhere."""
        return [
            self._schedules[k.name].kernel_schedule()
            if k.name in self._schedules
            else default_schedule(k, self.lowered.buffers)
            for k in self.lowered.kernels
        ]


def load(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Program:
    """Load and lower a model (symbolic input dims need ``input_shapes``)."""
    graph = load_graph(model, supported_ops=supported_ops(), input_shapes=input_shapes)
    if not graph.is_static:
        dynamic = {v.name: list(v.shape) for v in graph.inputs if not v.is_static}
        raise ScheduleError(f"inputs with symbolic dims need input_shapes: {dynamic}")
    return Program(graph, lower(graph))
