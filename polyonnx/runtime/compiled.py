"""The pipeline from a static Graph to native code, and one native call per inference."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from polyonnx.emit.jit import JitModule
from polyonnx.emit.module import ENTRY, emit_module
from polyonnx.emit.target import Target, host_target
from polyonnx.emit.threads import THREADS_GLOBAL, register_runtime_symbols
from polyonnx.errors import InputError
from polyonnx.frontend.graph import Graph
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.ir import Program
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.krnl.verify import check_bounds
from polyonnx.runtime.memory import ARENA, Layout, plan_memory
from polyonnx.schedule.default import default_schedule
from polyonnx.schedule.tree import KernelSchedule


def default_schedules(program: Program) -> tuple[KernelSchedule, ...]:
    return tuple(default_schedule(k, program.buffers) for k in program.kernels)


def lower_model(model, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Program:
    """Load, check and lower a model; symbolic input dims need ``input_shapes``."""
    graph = load_graph(model, supported_ops=supported_ops(), input_shapes=input_shapes)
    if not graph.is_static:
        dynamic = {v.name: list(v.shape) for v in graph.inputs if not v.is_static}
        raise InputError(f"inputs with symbolic dims need concrete shapes: {dynamic}")
    return lower(graph)


def compile_graph(graph: Graph, target: Target | None = None) -> CompiledModel:
    program = lower(graph)
    return compile_program(program, default_schedules(program), target)


def compile_program(
    program: Program, schedules: Sequence[KernelSchedule], target: Target | None = None
) -> CompiledModel:
    target = target or host_target()
    check_bounds(program)
    layout = plan_memory(program)
    places = {name: (p.slot, p.offset) for name, p in layout.places.items()}
    module, symbols = emit_module(schedules, program.buffers, places, target)
    return CompiledModel(
        program, tuple(schedules), layout, JitModule(module, target), tuple(symbols)
    )


@dataclass
class CompiledModel:
    """Native code for one Program with fixed shapes. ``run`` is one ctypes call."""

    program: Program
    schedules: tuple[KernelSchedule, ...]
    layout: Layout
    jit: JitModule
    symbols: tuple[str, ...]
    """Per kernel, the LLVM function it runs (identical kernels share one)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.jit.address(ENTRY))
        self._arena = np.empty(max(self.layout.arena_bytes, 64) + 64, dtype=np.uint8)
        arena_ptr = (self._arena.ctypes.data + 63) // 64 * 64
        self._slots = (ctypes.c_void_p * len(self.layout.slots))()
        for i, name in enumerate(self.layout.slots):
            if name == ARENA:
                self._slots[i] = arena_ptr
            elif name in self.program.constants:
                self._slots[i] = self.program.constants[name].ctypes.data

    def set_threads(self, count: int) -> None:
        """How many threads the model's parallel loops use (if it has any)."""
        address = self.jit.global_address(THREADS_GLOBAL)
        if address is not None and register_runtime_symbols():
            ctypes.c_int32.from_address(address).value = max(int(count), 1)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs must already be validated: C-contiguous arrays of the right dtype/shape."""
        prog = self.program
        results: dict[str, np.ndarray] = {}
        with self._lock:
            for i, name in enumerate(self.layout.slots):
                if name in inputs:
                    self._slots[i] = inputs[name].ctypes.data
                elif name in prog.outputs and name not in prog.constants:
                    buf = prog.buffers[name]
                    results[name] = np.empty(buf.shape, dtype=buf.dtype)
                    self._slots[i] = results[name].ctypes.data
            self._entry(self._slots)
        for name in prog.outputs:
            if name not in results:
                source = inputs.get(name)
                results[name] = np.array(source if source is not None else prog.constants[name])
        return results
