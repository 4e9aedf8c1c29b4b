"""Threads inside the compiled model, with no Python per iteration.

A parallel loop's body is outlined into ``void body(ptr ctx, i64 lo, i64 hi)`` (hi
inclusive) and run through the module's ``polyonnx_parallel_for(body, ctx, lo, hi_excl)``,
which passes it, with the module global ``polyonnx_threads`` (1 until the runtime sets it),
to the process-wide worker pool of emit/pool.py. The pool is compiled once per process,
the first time a module that calls it is compiled.
"""

from __future__ import annotations

import ctypes
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from polyonnx.emit.llvmtypes import I64, PTR
from polyonnx.emit.pool import BODY_TYPE, PLACEMENT_FUNCTIONS, POOL_RUN, pool_module
from polyonnx.emit.samples import define_samples

THREADS_GLOBAL = "polyonnx_threads"
PARALLEL_FOR = "polyonnx_parallel_for"
I32 = ir.IntType(32)
LIBC_FUNCTIONS = (
    "pthread_create",
    "pthread_attr_init",
    "pthread_attr_setstacksize",
    "pthread_attr_destroy",
    "getpid",
    "syscall",
    "usleep",
    "sched_yield",
)


@cache
def register_runtime_symbols() -> bool:
    """Make the libc functions the pool calls known to the JIT; False if one is missing."""
    return _register(LIBC_FUNCTIONS)


@cache
def register_placement_symbols() -> bool:
    """Likewise for the pool's placement (pool.py's PLACEMENT_FUNCTIONS), which is left out
    where libc lacks one."""
    return _register(PLACEMENT_FUNCTIONS)


def _register(names) -> bool:
    libc = ctypes.CDLL(None)
    found = [getattr(libc, name, None) for name in names]
    if any(fn is None for fn in found):
        return False
    for name, fn in zip(names, found, strict=True):
        llvm.add_symbol(name, ctypes.cast(fn, ctypes.c_void_p).value)
    return True


@cache
def pool_runtime():
    """Compile the worker pool (once per process) and make POOL_RUN known to the JIT; the
    compiled module, kept alive here, or None where threads are not available (the models'
    loops then run serially: the runtime leaves ``polyonnx_threads`` at 1). The module
    also holds emit/samples.py's body, which runs a batch's samples side by side."""
    from polyonnx.emit.jit import JitModule
    from polyonnx.target import host_target

    if not register_runtime_symbols():
        return None
    target = host_target()
    module = pool_module(target.triple, register_placement_symbols())
    define_samples(module)
    jit = JitModule.from_module(module, target)
    llvm.add_symbol(POOL_RUN, jit.address(POOL_RUN))
    return jit


def calls_pool(source: str) -> bool:
    """Whether a module's IR text declares (so calls) the pool."""
    return any(line.startswith("declare") and POOL_RUN in line for line in source.splitlines())


def parallel_for(module: ir.Module) -> ir.Function:
    """The module's ``polyonnx_parallel_for`` (defined on first use)."""
    existing = module.globals.get(PARALLEL_FOR)
    if existing is not None:
        return existing
    threads = ir.GlobalVariable(module, I32, THREADS_GLOBAL)
    threads.initializer = ir.Constant(I32, 1)
    run_type = ir.FunctionType(ir.VoidType(), [BODY_TYPE.as_pointer(), PTR, I64, I64, I32])
    run = ir.Function(module, run_type, POOL_RUN)
    signature = [BODY_TYPE.as_pointer(), PTR, I64, I64]  # typed: llvmlite calls through it
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), signature), PARALLEL_FOR)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.call(run, [*fn.args, b.load(threads, typ=I32)])
    b.ret_void()
    return fn
