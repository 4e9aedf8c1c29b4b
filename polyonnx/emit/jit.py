"""Load a model's object files into this process (MCJIT links them), and the LLVM
machine and optimisation pipeline every compile uses."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from polyonnx.emit.module import CLOCK_GETTIME, register_profile_symbols
from polyonnx.emit.pool import POOL_RUN
from polyonnx.emit.threads import calls_pool, pool_runtime
from polyonnx.errors import CodegenError
from polyonnx.target import Target, initialize_llvm, initialize_llvm_targets


def _pipeline_options():
    """LLVM's O2 pipeline without its loop and SLP vectorizers: polyonnx emits SIMD
    explicitly, so they only add versioned loops and compile time. Measured on light
    SqueezeNet / ResNet-50: compile 7.9 → 3.9 s / 16.4 → 9.4 s, and inference 209 → 128 ms /
    3.65 → 2.53 s against O3 with them."""
    options = llvm.create_pipeline_tuning_options(speed_level=2)
    options.loop_vectorization = False
    options.slp_vectorization = False
    options.loop_unrolling = True
    return options


class JitModule:
    """Object files loaded into this process; keeps the execution engine (and so the
    code) alive. ``sources``: the IR they were compiled from, where known (not for code
    from the compile cache)."""

    def __init__(self, objects: Sequence[bytes], target: Target, sources: Sequence[str] = ()):
        self.objects = tuple(bytes(obj) for obj in objects)
        self.sources = tuple(sources)
        self._target = target
        self._machine = target_machine(target)
        if self.sources:
            pool = any(calls_pool(text) for text in self.sources)
        else:
            pool = any(POOL_RUN.encode() in obj for obj in self.objects)
        self._engine = _load(self.objects, self._machine, pool)

    @classmethod
    def from_module(cls, module: ir.Module, target: Target) -> JitModule:
        """Compile one module and load it."""
        from polyonnx.emit.objects import compile_ir

        text = str(module)
        return cls([compile_ir(text, target, pic=False)], target, [text])

    @property
    def source(self) -> str | None:
        """The IR of every module, one after another."""
        return "\n".join(self.sources) if self.sources else None

    @property
    def optimized(self) -> str:
        """The optimised IR of every module (optimised again: it is not kept)."""
        if not self.sources:
            raise CodegenError("code loaded from the compile cache has no IR to show")
        return "\n".join(str(self._optimized(text)) for text in self.sources)

    def _optimized(self, text: str) -> llvm.ModuleRef:
        module = llvm.parse_assembly(text)
        optimize(module, self._machine)
        return module

    def address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise CodegenError(f"symbol {name!r} is not in the compiled module")
        return addr

    def global_address(self, name: str) -> int | None:
        """The address of a global variable of the module, if it has one."""
        if not any(name.encode() in obj for obj in self.objects):
            return None
        return self._engine.get_global_value_address(name) or None

    def assembly(self) -> str:
        if not self.sources:
            raise CodegenError("code loaded from the compile cache has no IR to show")
        return "\n".join(
            self._machine.emit_assembly(self._optimized(text)) for text in self.sources
        )


def target_machine(target: Target, opt: int = 3, *, jit: bool = True) -> llvm.TargetMachine:
    """LLVM's machine for ``target``: for this process (``jit``), or position-independent
    code for a shared library."""
    initialize_llvm()
    if target.triple != llvm.get_process_triple():
        initialize_llvm_targets()
    reloc = "default" if jit else "pic"
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.name, features=target.features, opt=opt, reloc=reloc, jit=jit
    )


def optimize(module: llvm.ModuleRef, machine: llvm.TargetMachine) -> None:
    """Run the optimisation pipeline (see _pipeline_options) on ``module`` in place."""
    builder = llvm.create_pass_builder(machine, _pipeline_options())
    builder.getModulePassManager().run(module, builder)


COMPILER_RUNTIME = ("__extendhfsf2", "__truncsfhf2", "__truncdfhf2")
"""The half-precision conversions LLVM calls where the CPU has no F16C (an x86-64
baseline target): a linked library gets them from the C compiler's runtime, the JIT
from libgcc_s."""


@cache
def register_compiler_runtime() -> None:
    """Make COMPILER_RUNTIME's functions known to the JIT where libgcc_s has them."""
    try:
        runtime = ctypes.CDLL("libgcc_s.so.1")
    except OSError:
        return
    for name in COMPILER_RUNTIME:
        fn = getattr(runtime, name, None)
        if fn is not None:
            llvm.add_symbol(name, ctypes.cast(fn, ctypes.c_void_p).value)


def _load(
    objects: Sequence[bytes], machine: llvm.TargetMachine, pool: bool
) -> llvm.ExecutionEngine:
    """An execution engine holding the object files, their symbols resolved across them
    and to the worker pool's (``pool``: they call it) and the profiling clock's."""
    if pool:
        pool_runtime()
    register_compiler_runtime()
    clock = any(CLOCK_GETTIME.encode() in obj for obj in objects)
    if clock and not register_profile_symbols():
        raise CodegenError("profiling needs clock_gettime(CLOCK_MONOTONIC) from the C library")
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
    for data in objects:
        engine.add_object_file(llvm.ObjectFileRef.from_data(data))
    engine.finalize_object()
    return engine
