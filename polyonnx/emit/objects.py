"""A model's LLVM modules compiled to object files, the kernels' in parallel.

Each distinct kernel function is its own module (emit/module.py's plan): emitting it in
Python, LLVM's optimisation and code generation take most of a cold compile, and the
kernels do not depend on each other. With more than one core and enough kernels, forked
worker processes each emit, optimise and compile a share, largest first (a fork inherits
the schedules, so nothing is sent to them but an index). llvmlite serialises every LLVM
call behind one lock, so threads would not help. The garbage collector is off while
emitting: it walked the huge live IR graphs again and again (docs/measurements.md).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from polyonnx.emit.module import KernelJob, kernel_module
from polyonnx.errors import CodegenError, PolyonnxError
from polyonnx.target import Target, initialize_llvm

PARALLEL_JOBS = 4
"""Fewer distinct kernels than this compile in this process: a fork and a pool cost
tens of milliseconds, a small model's whole compile (docs/measurements.md)."""
LOCAL = {llvm.Linkage.internal, llvm.Linkage.private}


@dataclass(frozen=True)
class Objects:
    """Object files of one model and the IR they came from (for reading, not reused)."""

    objects: tuple[bytes, ...]
    sources: tuple[str, ...]


def compile_objects(
    entry: ir.Module,
    jobs: Sequence[KernelJob],
    buffers: Mapping[str, object],
    target: Target,
    *,
    pic: bool = False,
    workers: int | None = None,
) -> Objects:
    """The entry module and every job's kernel module, optimised and compiled for
    ``target``; ``pic``: position-independent code with every symbol hidden, for a shared
    library. ``workers``: processes (default POLYONNX_COMPILE_JOBS, else one per core)."""
    with gc_paused():
        entry_text = str(entry)
        results = _run_jobs(jobs, buffers, target, pic, workers)
        entry_object = compile_ir(entry_text, target, pic)
    objects = (entry_object, *(obj for obj, _ in results))
    return Objects(objects, (entry_text, *(text for _, text in results)))


@contextmanager
def gc_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def compile_ir(text: str, target: Target, pic: bool) -> bytes:
    """One module's IR text, verified, optimised and compiled to an object file."""
    from polyonnx.emit.jit import optimize

    try:
        module = llvm.parse_assembly(text)
        module.verify()
    except RuntimeError as exc:
        raise CodegenError(f"generated LLVM IR is invalid: {exc}") from exc
    if pic:
        hide_symbols(module)
    machine = _machine(target, pic)
    optimize(module, machine)
    return machine.emit_object(module)


def hide_symbols(module: llvm.ModuleRef) -> None:
    """Every symbol the module defines, hidden: a library exports its C API only."""
    for symbol in [*module.functions, *module.global_variables]:
        if not symbol.is_declaration and symbol.linkage not in LOCAL:
            symbol.visibility = "hidden"


@cache
def _machine(target: Target, pic: bool) -> llvm.TargetMachine:
    from polyonnx.emit.jit import target_machine

    return target_machine(target, jit=not pic)


_WORK: tuple | None = None
"""(jobs, buffers, target, pic) for forked workers, which inherit it."""


def _run_jobs(jobs, buffers, target, pic, workers) -> list[tuple[bytes, str]]:
    global _WORK
    count = _worker_count(workers, len(jobs))
    order = sorted(range(len(jobs)), key=lambda i: -_cost(jobs[i]))
    _WORK = (jobs, buffers, target, pic)
    try:
        if count <= 1:
            done = [_compile_job(i) for i in order]
        else:
            with multiprocessing.get_context("fork").Pool(count) as pool:
                done = list(pool.imap_unordered(_compile_job, order, chunksize=1))
    finally:
        _WORK = None
    failed = [error for _, _, error, _ in done if error is not None]
    if failed:
        raise _rebuilt(failed[0])
    by_index = {index: (obj, text) for index, obj, _, text in done}
    return [by_index[i] for i in range(len(jobs))]


def _compile_job(index: int):
    """Emit and compile job ``index``: (index, object, error, IR text); the error as
    (type name, message), so that it crosses the process boundary whatever it is."""
    jobs, buffers, target, pic = _WORK
    try:
        if multiprocessing.parent_process() is not None:
            gc.disable()  # a short-lived worker: nothing to collect
        initialize_llvm()
        text = str(kernel_module(jobs[index], buffers, target))
        return index, compile_ir(text, target, pic), None, text
    except Exception as exc:  # reported by the parent, with its type
        return index, b"", (type(exc).__name__, str(exc)), ""


def _rebuilt(error: tuple[str, str]) -> Exception:
    name, message = error
    if name == "CodegenError":
        return CodegenError(message)
    return PolyonnxError(f"{name} while compiling a kernel: {message}")


def _worker_count(workers: int | None, jobs: int) -> int:
    if workers is None:
        workers = int(os.environ.get("POLYONNX_COMPILE_JOBS", os.cpu_count() or 1))
    if jobs < PARALLEL_JOBS or sys.platform != "linux":
        return 1
    return max(1, min(workers, jobs))


def _cost(job: KernelJob) -> int:
    """A rough size of the code a job makes: GEMM micro-kernels are the largest."""
    tree = job.schedule.tree
    return len(tree) * (8 if "ukernel" in tree else 1) * len(job.schedule.kernel.statements)
