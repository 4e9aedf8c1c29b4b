"""The whole model as one LLVM module: a function per kernel and one entry,
``void polyonnx_main(ptr %slots)``, that calls the kernels in order with pointers
computed from the slot array and arena offsets.

A kernel with run-time checks (krnl/ir.py's Checked) also gets the error record, an
``i64 [site, value]`` the caller zeroes before each run, whose pointer is in the slot
``errors``: after such a kernel the entry returns at once if a check failed.

A profiling build (``profile=True``) also reads CLOCK_MONOTONIC (libc's
``clock_gettime``) before the first kernel call and after every one, and adds each
kernel call's elapsed nanoseconds and one call to the module global
``polyonnx_profile``: ``[2 * kernels x i64]``, (nanoseconds, calls) per call site, in
call order. The default build has none of this.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from polyonnx.emit.codegen import emit_kernel, has_checks, kernel_arguments
from polyonnx.emit.llvmtypes import I64, PTR
from polyonnx.emit.threads import THREADS_GLOBAL
from polyonnx.krnl.canon import structural_key
from polyonnx.krnl.ir import Buffer
from polyonnx.schedule.astgen import kernel_parameters
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.target import Target

ENTRY = "polyonnx_main"
PROFILE_GLOBAL = "polyonnx_profile"
CLOCK_GETTIME = "clock_gettime"
NOW_NS = "polyonnx_now_ns"
I32 = ir.IntType(32)


def kernel_symbol(index: int, name: str) -> str:
    clean = "".join(c if c.isalnum() else "_" for c in name)[:48]
    return f"k{index}_{clean}"


@dataclass(frozen=True)
class KernelJob:
    """One function to emit: a kernel's code under ``symbol``."""

    symbol: str
    schedule: KernelSchedule
    checks: bool = True
    """Whether its code makes the kernel's run-time checks (krnl/ir.py's Checked)."""


@dataclass(frozen=True)
class ModulePlan:
    """A model as LLVM modules: the entry module, which calls the kernels through
    declarations and defines THREADS_GLOBAL, and one job per distinct kernel function."""

    entry: ir.Module
    jobs: tuple[KernelJob, ...]
    symbols: tuple[str, ...]
    """Per kernel, the symbol of the function it calls."""


def kernel_jobs(
    schedules: Sequence[KernelSchedule], buffers: Mapping[str, Buffer], checks: bool = True
) -> tuple[list[KernelJob], list[str]]:
    """One job per structurally distinct kernel (same statements, shapes, dtypes and
    schedule; other tensors: one function), and per kernel the symbol it calls."""
    first: dict[str, KernelJob] = {}
    symbols = []
    for i, s in enumerate(schedules):
        key = structural_key(s.kernel, buffers, s.tree + f"panels{len(s.panels)}")
        if key not in first:
            first[key] = KernelJob(kernel_symbol(i, s.kernel.name), s, checks)
        symbols.append(first[key].symbol)
    return list(first.values()), symbols


def plan_modules(
    schedules: Sequence[KernelSchedule],
    buffers: Mapping[str, Buffer],
    places: Mapping[str, tuple[int, int]],
    target: Target,
    *,
    profile: bool = False,
    errors: int | None = None,
    checks: bool = True,
    params: int | None = None,
) -> ModulePlan:
    """``places`` maps each buffer to (slot index, byte offset); ``errors`` is the slot of
    the error record (None: a private one, for code that is only read); without
    ``checks`` the code makes no run-time checks; ``params`` is the slot of the parameters'
    int64 values, for parametric kernels (krnl/params.py). The kernels'
    modules are made from the jobs by :func:`kernel_module`, anywhere (emit/objects.py
    compiles them in parallel). With ``profile``, the entry times every kernel call into
    :data:`PROFILE_GLOBAL` (the JIT then needs :func:`register_profile_symbols`)."""
    jobs, symbols = kernel_jobs(schedules, buffers, checks)
    module = _new_module("polyonnx", target)
    threads = ir.GlobalVariable(module, I32, THREADS_GLOBAL)
    threads.initializer = ir.Constant(I32, 1)
    signature = {job.symbol: kernel_arguments(job.schedule, checks) for job in jobs}
    functions = {
        name: ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * count), name)
        for name, count in signature.items()
    }
    calls = [functions[symbol] for symbol in symbols]
    _define_entry(module, schedules, calls, places, _Entry(profile, errors, checks, params))
    return ModulePlan(module, tuple(jobs), tuple(symbols))


def kernel_module(job: KernelJob, buffers: Mapping[str, Buffer], target: Target) -> ir.Module:
    """The module of one kernel function: every other symbol it defines is internal, and
    THREADS_GLOBAL is the entry module's."""
    module = _new_module(job.symbol, target)
    emit_kernel(module, job.symbol, job.schedule, buffers, target.lanes(4), checks=job.checks)
    for value in module.globals.values():
        if value.name == job.symbol or _declaration(value):
            continue
        if value.name == THREADS_GLOBAL:
            value.initializer = None  # external: defined once, by the entry module
        else:
            value.linkage = "internal"
    return module


def emit_module(
    schedules: Sequence[KernelSchedule],
    buffers: Mapping[str, Buffer],
    places: Mapping[str, tuple[int, int]],
    target: Target,
    *,
    profile: bool = False,
    errors: int | None = None,
    checks: bool = True,
) -> tuple[ir.Module, list[str]]:
    """The whole model in one module, for reading its IR (the tests, ``polyonnx show``);
    compiling uses :func:`plan_modules`. Returns the module and, per kernel, the symbol
    of the function it calls."""
    jobs, symbols = kernel_jobs(schedules, buffers, checks)
    module = _new_module("polyonnx", target)
    width = target.lanes(4)
    functions = {
        j.symbol: emit_kernel(module, j.symbol, j.schedule, buffers, width, checks=checks)
        for j in jobs
    }
    calls = [functions[s] for s in symbols]
    _define_entry(module, schedules, calls, places, _Entry(profile, errors, checks))
    return module, symbols


def _new_module(name: str, target: Target) -> ir.Module:
    module = ir.Module(name)
    module.triple = target.triple
    module.cpu_features = target.features  # what emit/mathfn.py may use beyond plain IR
    return module


def _declaration(value: ir.GlobalValue) -> bool:
    if isinstance(value, ir.Function):
        return value.is_declaration
    return isinstance(value, ir.GlobalVariable) and value.initializer is None


@dataclass(frozen=True)
class _Entry:
    """How the entry is built: with kernel timers, where the error record is, and whether
    the kernels make run-time checks."""

    profile: bool
    errors: int | None
    checks: bool = True
    params: int | None = None
    """The slot of the parameters' values (a parametric model), else None."""


def _define_entry(
    module: ir.Module,
    schedules: Sequence[KernelSchedule],
    calls: Sequence[ir.Function],
    places: Mapping[str, tuple[int, int]],
    how: _Entry,
) -> None:
    """``void polyonnx_main(ptr slots)``: each kernel called, in order, with its buffers'
    pointers (slot base plus offset, computed once per place), and returning early after
    a kernel whose run-time check failed."""
    entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), ENTRY)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    slots = entry.args[0]
    pointers: dict[tuple[int, int], ir.Value] = {}
    clock = _ProfileClock(module, b, len(schedules)) if how.profile else None
    errors = None
    for site, (fn, schedule) in enumerate(zip(calls, schedules, strict=True)):
        args = [_place_pointer(b, slots, places[name], pointers) for name in schedule.buffers()]
        if kernel_parameters(schedule.kernel.statements):
            args.append(_place_pointer(b, slots, (how.params, 0), pointers))
        checked = has_checks(schedule, how.checks)
        if checked and errors is None:
            errors = _error_record(module, b, slots, how.errors)
        if checked:
            args.append(errors)
        b.call(fn, args)
        if clock is not None:
            clock.lap(site)
        if checked:
            failed = b.icmp_unsigned("!=", b.load(errors, typ=I64), ir.Constant(I64, 0))
            with b.if_then(failed, likely=False):
                b.ret_void()
    b.ret_void()


def _place_pointer(
    b: ir.IRBuilder, slots: ir.Value, place: tuple[int, int], pointers: dict
) -> ir.Value:
    """The pointer to (slot, byte offset), computed once per place."""
    if place not in pointers:
        slot_ptr = b.gep(slots, [ir.Constant(I64, place[0])], inbounds=True, source_etype=PTR)
        base = b.load(slot_ptr, typ=PTR)
        pointers[place] = b.gep(
            base, [ir.Constant(I64, place[1])], inbounds=True, source_etype=ir.IntType(8)
        )
    return pointers[place]


def _error_record(
    module: ir.Module, b: ir.IRBuilder, slots: ir.Value, slot: int | None
) -> ir.Value:
    """The error record's pointer: from slot ``slot``, or a private global without one."""
    if slot is None:
        record = ir.GlobalVariable(module, ir.ArrayType(I64, 2), "polyonnx_errors")
        record.initializer = ir.Constant(ir.ArrayType(I64, 2), None)
        record.linkage = "private"
        return record
    at = b.gep(slots, [ir.Constant(I64, slot)], inbounds=True, source_etype=PTR)
    return b.load(at, typ=PTR)


@cache
def register_profile_symbols() -> bool:
    """Make libc's ``clock_gettime`` known to the JIT; False if it is not there."""
    fn = getattr(ctypes.CDLL(None), CLOCK_GETTIME, None)
    if fn is None or not hasattr(time, "CLOCK_MONOTONIC"):
        return False
    llvm.add_symbol(CLOCK_GETTIME, ctypes.cast(fn, ctypes.c_void_p).value)
    return True


class _ProfileClock:
    """Reads the clock in the entry as it is built: once now, then at every ``lap``, which
    adds the time since the previous read to the call site's counters."""

    def __init__(self, module: ir.Module, b: ir.IRBuilder, sites: int):
        self.b = b
        self.counters = ir.GlobalVariable(module, ir.ArrayType(I64, 2 * sites), PROFILE_GLOBAL)
        self.counters.initializer = ir.Constant(ir.ArrayType(I64, 2 * sites), None)
        self.now = _now_ns(module)
        self.last = b.call(self.now, [])

    def lap(self, site: int) -> None:
        b = self.b
        now = b.call(self.now, [])
        self._add(2 * site, b.sub(now, self.last))
        self._add(2 * site + 1, ir.Constant(I64, 1))
        self.last = now

    def _add(self, index: int, amount: ir.Value) -> None:
        b = self.b
        zero = ir.Constant(I64, 0)
        slot = b.gep(self.counters, [zero, ir.Constant(I64, index)], inbounds=True)
        b.store(b.add(b.load(slot, typ=I64), amount), slot)


def _now_ns(module: ir.Module) -> ir.Function:
    """``i64 polyonnx_now_ns()``: CLOCK_MONOTONIC in nanoseconds (a 64-bit timespec)."""
    timespec = ir.LiteralStructType([I64, I64])
    gettime = ir.Function(module, ir.FunctionType(I32, [I32, PTR]), CLOCK_GETTIME)
    fn = ir.Function(module, ir.FunctionType(I64, []), NOW_NS)
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    spec = b.alloca(timespec, name="ts")
    b.call(gettime, [ir.Constant(I32, time.CLOCK_MONOTONIC), spec])
    zero = ir.Constant(I32, 0)
    fields = [
        b.gep(spec, [zero, ir.Constant(I32, k)], inbounds=True, source_etype=timespec)
        for k in (0, 1)
    ]
    seconds, nanos = (b.load(f, typ=I64) for f in fields)
    b.ret(b.add(b.mul(seconds, ir.Constant(I64, 1_000_000_000)), nanos))
    return fn
