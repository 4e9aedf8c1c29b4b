"""The pipeline from a static Graph to native code, and one native call per inference.

A model compiled with ``profile=True`` times every kernel call inside the native entry
(CLOCK_MONOTONIC, nanoseconds); :meth:`CompiledModel.kernel_profile` reads the totals::

    compiled = compile_graph(graph, profile=True)
    compiled.run(feed)
    for record in compiled.kernel_profile():
        print(record.kernel, record.op_type, record.seconds, record.calls, record.share)
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import islpy as isl
import numpy as np

from polyonnx.aligned import ALIGN, aligned_empty
from polyonnx.emit.abi import CheckInfo, EntryAbi, KernelInfo, Port
from polyonnx.emit.aot import NativeModel
from polyonnx.emit.jit import JitModule
from polyonnx.emit.module import (
    ENTRY,
    PROFILE_GLOBAL,
    plan_modules,
    register_profile_symbols,
)
from polyonnx.emit.objects import compile_objects, gc_paused
from polyonnx.emit.threads import THREADS_GLOBAL, pool_runtime
from polyonnx.errors import CodegenError, InputError, PolyonnxError, RunError
from polyonnx.frontend.graph import Graph
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.canon import structural_key
from polyonnx.krnl.chain import fuse_elementwise
from polyonnx.krnl.epilogue import fuse_epilogues
from polyonnx.krnl.ir import Binary, Kernel, Program, checks
from polyonnx.krnl.islutil import parse_set
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.krnl.verify import check_bounds
from polyonnx.runtime.cache import Entry
from polyonnx.runtime.memory import ARENA, Layout, plan_memory
from polyonnx.runtime.side_by_side import SideBySide, pool_available
from polyonnx.schedule.gemm import geometry
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.heuristics.panels import pack_constants, panel_only
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.target import Target, host_target


def default_schedules(program: Program, target: Target | None = None) -> tuple[KernelSchedule, ...]:
    """Each kernel's default schedule for ``target``'s SIMD width and registers (the
    host's by default). Structurally identical kernels (krnl/canon.py: other tensors,
    same statements and shapes) get one schedule, worked out once: a ResNet's blocks
    repeat, and scheduling them again was half of scheduling (docs/measurements.md)."""
    target = target or host_target()
    lanes, registers = target.lanes(4), target.vector_registers
    done: dict[str, KernelSchedule] = {}
    schedules = []
    for kernel in program.kernels:
        key = structural_key(kernel, program.buffers)
        schedule = _for_kernel(done.get(key), kernel)
        if schedule is None:
            schedule = default_schedule(kernel, program.buffers, lanes, registers)
            if _shareable(schedule, kernel):
                done[key] = schedule
        schedules.append(schedule)
    return tuple(schedules)


def _shareable(schedule: KernelSchedule, kernel: Kernel) -> bool:
    """Whether ``schedule`` names nothing of ``kernel`` but its statements: it schedules
    the kernel as given, and its state added no statements or scratch buffers."""
    state = schedule.state
    plain = state is None or (state.kernel is kernel and not state.scratch)
    return schedule.kernel is kernel and not schedule.panels and plain


def _for_kernel(schedule: KernelSchedule | None, kernel: Kernel) -> KernelSchedule | None:
    """A shared schedule given to an identical ``kernel``."""
    if schedule is None:
        return None
    state = schedule.state and dataclasses.replace(schedule.state, kernel=kernel)
    return dataclasses.replace(schedule, kernel=kernel, state=state)


def lower_model(model, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Program:
    """Load, check and lower a model; symbolic input dims need ``input_shapes``."""
    graph = load_graph(model, supported_ops=supported_ops(), input_shapes=input_shapes)
    if not graph.is_static:
        dynamic = {v.name: list(v.shape) for v in graph.inputs if not v.is_static}
        raise InputError(
            f"inputs with symbolic dims need concrete shapes (--shape NAME=D0,D1,...): {dynamic}"
        )
    return optimize(lower(graph))


def optimize(program: Program, keep: frozenset[str] = frozenset()) -> Program:
    """Program-level rewrites of the default pipeline: chains of elementwise kernels
    become one (krnl/chain.py), then elementwise kernels after a contraction become its
    epilogue (krnl/epilogue.py). The kernels named in ``keep`` (scripted ones) take part
    in neither."""
    program = fuse_elementwise(program, keep)
    return fuse_epilogues(program, lambda kernel: _has_contraction(kernel, program), keep)


def _has_contraction(kernel: Kernel, program: Program) -> bool:
    return any(geometry(s, program.buffers) is not None for s in kernel.statements)


def compile_graph(
    graph: Graph,
    target: Target | None = None,
    *,
    profile: bool = False,
    records=None,
    input_offsets: Mapping[str, int] | None = None,
    checks: bool = True,
) -> CompiledModel:
    """With ``records`` (tune/apply.py's Records), kernels with a tuning record that beat
    the default get its schedule (host targets only). ``input_offsets``: where inputs'
    data starts past a cache line, in bytes, for code laid out by it (Program's).
    ``checks``: see :func:`compile_program`."""
    with gc_paused():  # compiling makes few cycles and many objects (emit/objects.py)
        program = optimize(lower(graph, input_offsets))
        schedules, used = model_schedules(program, target, records)
        compiled = compile_program(program, schedules, target, profile=profile, checks=checks)
    compiled.tuned = tuple(used)
    return compiled


def model_schedules(
    program: Program, target: Target | None, records=None
) -> tuple[Sequence[KernelSchedule], Mapping[str, object]]:
    """Each kernel's schedule, and the tuning records used (by kernel name): the records'
    where they beat the default, for the host only (``target`` None), else the defaults."""
    defaults = default_schedules(program, target)
    if records is None or target is not None:
        return defaults, {}
    return records.schedules(program, defaults)


def compile_program(
    program: Program,
    schedules: Sequence[KernelSchedule],
    target: Target | None = None,
    *,
    profile: bool = False,
    checks: bool = True,
) -> CompiledModel:
    """With ``profile``, the native entry also times every kernel call (a few clock reads
    per inference); without, it is exactly the plain build. Without ``checks``, the code
    does not check the indices and integer divisors a user gives (docs/ops.md): a bad one
    is clamped or divides to 0, silently, for the few percent the checks cost."""
    target = target or host_target()
    native = emit_program(program, schedules, target, profile=profile, checks=checks)
    model = native.model
    objects = compile_objects(model.plan.entry, model.plan.jobs, model.buffers, target)
    jit = JitModule(objects.objects, target, objects.sources)
    return CompiledModel(
        model.abi, model.constants, jit, native.memory, profile, build=native.build
    )


@dataclass(frozen=True)
class NativeProgram:
    """A Program planned as LLVM modules, with the entry's ABI and its constants
    (``model``: the entry's module and a job per kernel function, for emit/objects.py to
    emit and compile), and what compiling it made on the way."""

    model: NativeModel
    memory: MemoryUse
    build: Build


def emit_program(
    program: Program,
    schedules: Sequence[KernelSchedule],
    target: Target,
    *,
    profile: bool,
    checks: bool = True,
) -> NativeProgram:
    """Pack constant GEMM weights, check bounds, plan memory and the modules (with
    run-time checks, or without: see :func:`compile_program`)."""
    program, schedules = pack_constants(program, tuple(schedules), target)
    check_bounds(program)
    layout = plan_memory(program)
    places = {name: (p.slot, p.offset) for name, p in layout.places.items()}
    if profile and not register_profile_symbols():
        raise CodegenError("profiling needs clock_gettime(CLOCK_MONOTONIC) from the C library")
    abi = entry_abi(program, schedules, layout, checks, panel_only(program, schedules))
    plan = plan_modules(
        schedules,
        program.buffers,
        places,
        target,
        profile=profile,
        errors=abi.error_slot,
        checks=checks,
    )
    used = {name for _, name in abi.constant_slots}
    used |= {p.copy_of for p in abi.outputs if p.copy_of in program.constants}
    build = Build(program, tuple(schedules), layout, plan.symbols)
    constants = {name: program.constants[name] for name in used}
    memory = memory_use(program, schedules, layout, constants)
    model = NativeModel(plan, program.buffers, abi, constants)
    return NativeProgram(model, memory, build)


def entry_abi(
    program: Program,
    schedules: Sequence[KernelSchedule],
    layout: Layout,
    checks: bool = True,
    aliases: Mapping[str, str] | None = None,
) -> EntryAbi:
    """The slots of the entry ``layout`` plans and the model's ports, in ONNX order. A
    constant of ``aliases`` (``panel_only``) has its panel copy in its slot: its own
    bytes are not kept."""
    aliases = aliases or {}
    slot = {name: i for i, name in enumerate(layout.slots)}
    inputs, outputs = entry_ports(program, slot)
    return EntryAbi(
        inputs=inputs,
        outputs=outputs,
        constant_slots=tuple(
            (slot[n], aliases.get(n, n)) for n in layout.slots if n in program.constants
        ),
        arena_slot=slot[ARENA],
        arena_bytes=layout.arena_bytes,
        kernels=tuple(
            KernelInfo(s.kernel.name, s.kernel.op_type, multiply_adds(s.kernel)) for s in schedules
        ),
        input_offsets=tuple(sorted(program.input_offsets.items())),
        checks=check_table(schedules) if checks else (),
    )


def check_table(schedules: Sequence[KernelSchedule]) -> tuple[CheckInfo, ...]:
    """Every run-time check the kernels' code makes, by site number."""
    sites = {
        check.site.id: check.site.text()
        for s in schedules
        for stmt in s.kernel.statements
        for check in checks(stmt.expr)
    }
    return tuple(CheckInfo(site, text) for site, text in sorted(sites.items()))


def entry_ports(
    program: Program, slot: Mapping[str, int]
) -> tuple[tuple[Port, ...], tuple[Port, ...]]:
    """The model's inputs and outputs as ports, in ONNX order, with the entry's ``slot``
    of each buffer; an output that is an input or a constant is a copy of it. A dim that
    is not a number (a parametric program's) is -1."""
    external = set(program.inputs) | set(program.constants)

    def port(name: str, copy: bool) -> Port:
        buffer = program.buffers[name]
        copied = name if copy and name in external else None
        where = None if copied else slot.get(name)
        shape = tuple(d if isinstance(d, int) else -1 for d in buffer.shape)
        return Port(name, buffer.dtype, shape, where, copied)

    return (
        tuple(port(name, False) for name in program.inputs),
        tuple(port(name, True) for name in program.outputs),
    )


def memory_use(
    program: Program,
    schedules: Sequence[KernelSchedule],
    layout: Layout,
    kept: Mapping[str, np.ndarray],
) -> MemoryUse:
    """The bytes of the arena (and its lower bound) and of the constants ``kept``."""
    copies = {copy for s in schedules for _, copy in s.panels}
    return MemoryUse(
        layout.arena_bytes,
        layout.lower_bound_bytes,
        sum(array.nbytes for array in kept.values()),
        sum(kept[name].nbytes for name in copies if name in kept),
    )


POISON = "POLYONNX_POISON_ARENA"
"""When set, intermediates' memory starts as 0xff bytes, not as whatever the allocator
returns (fresh pages are zero): a kernel that reads a temp before writing it then gives
NaN, where zeros could pass for a correct result. The tests set it. Outputs then start as
0xff bytes on every run too, so an element a kernel never writes cannot pass for a stale
result of an earlier run (see ``KEPT_OUTPUTS``)."""

KEPT_OUTPUTS = 2
"""Per output, the arrays a model keeps to reuse: a run writes its result into an array
of an earlier run that nothing outside the model references any more, and allocates a new
one only when every kept array is still in use (two cover the usual loop, which holds the
last result while it asks for the next). A fresh array of more than the C library's mmap
threshold (32 MB at most) comes from the kernel as zeroed pages, faulted in while the
kernel writes (docs/measurements.md, 'Output arrays reused')."""


@dataclass(frozen=True)
class KernelProfile:
    """The calls of one kernel in a profiling build, summed over every run since the
    build or the last ``reset_profile``."""

    kernel: str
    op_type: str
    seconds: float
    calls: int
    share: float
    """Of the time of all kernels of the model (0 to 1)."""
    multiply_adds: int
    """Per call, the points of the kernel's contraction statements (``reduce == "add"``
    over a product); 0 for kernels that contract nothing."""

    @property
    def gflops(self) -> float | None:
        """Contraction speed, 2 * multiply-adds per second / 1e9; None without either."""
        if not self.multiply_adds or not self.calls or self.seconds <= 0:
            return None
        return 2 * self.multiply_adds * self.calls / self.seconds / 1e9


@dataclass(frozen=True)
class MemoryUse:
    """What a compiled model holds, in bytes."""

    arena: int
    """Every intermediate tensor, in one arena planned from their lifetimes."""
    lower_bound: int
    """The most bytes of intermediates live at one kernel: no plan can do with less."""
    constants: int
    """The model's constants, with ``panels`` among them."""
    panels: int
    """Copies of GEMM weights packed when compiling (schedule/heuristics/panels.py)."""


@dataclass(frozen=True)
class Build:
    """What compiling in this process made, beside the native code: absent from a model
    loaded from the compile cache."""

    program: Program
    schedules: tuple[KernelSchedule, ...]
    layout: Layout
    symbols: tuple[str, ...]
    """Per kernel, the LLVM function it runs (identical kernels share one)."""


@dataclass
class CompiledModel:
    """Native code for one Program with fixed shapes. ``run`` is one ctypes call."""

    abi: EntryAbi
    constants: Mapping[str, np.ndarray]
    jit: JitModule
    memory_use: MemoryUse
    profiling: bool = False
    """Built with per-kernel timers (see :meth:`kernel_profile`)."""
    tuned: tuple[str, ...] = ()
    """The kernels whose schedules came from tuning records."""
    build: Build | None = None
    cached: bool = False
    """Loaded from the compile cache (runtime/cache.py), not compiled."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        abi = self.abi
        self._entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.jit.address(ENTRY))
        self._arena = aligned_empty((max(abi.arena_bytes, ALIGN),), np.uint8)
        self._poison = bool(os.environ.get(POISON))
        if self._poison:  # every byte 0xff: NaN in floats, -1 in ints
            self._arena.fill(0xFF)
        self._slots = (ctypes.c_void_p * abi.slot_count)()
        self._slots[abi.arena_slot] = self._arena.ctypes.data
        self._errors = np.zeros(2, np.int64)
        """The error record: (site, value) of the run's first failed check, else zeros."""
        self._slots[abi.error_slot] = self._errors.ctypes.data
        for slot, name in abi.constant_slots:
            self._slots[slot] = self.constants[name].ctypes.data
        self._inputs = [(p.slot, p.name) for p in abi.inputs if p.slot is not None]
        self._outputs = [
            (p.slot, p.name, p.shape, np.dtype(p.dtype))
            for p in dict((p.name, p) for p in abi.outputs).values()
            if p.copy_of is None
        ]
        self._kept: dict[str, list[tuple[np.ndarray, int]]] = {
            name: [] for _, name, _, _ in self._outputs
        }
        self._passed = [(p.name, p.copy_of) for p in abi.outputs if p.copy_of is not None]
        """Outputs that are inputs or constants: copied, not computed."""
        self._groups: dict[int, SideBySide] = {}
        self.threads = 1
        """What ``set_threads`` set."""
        self._counters = None
        if self.profiling:
            words = ctypes.c_int64 * (2 * len(abi.kernels))
            address = self.jit.global_address(PROFILE_GLOBAL)
            self._counters = np.ctypeslib.as_array(words.from_address(address)).reshape(-1, 2)

    @classmethod
    def from_entry(cls, entry: Entry, target: Target, profile: bool = False) -> CompiledModel:
        """A model loaded from the compile cache: its object file and constants, no LLVM
        optimisation and no Program."""
        jit = JitModule(entry.objects, target)
        memory = MemoryUse(**entry.extra["memory"])
        tuned = tuple(entry.extra["tuned"])
        return cls(entry.abi, entry.constants, jit, memory, profile, tuned, cached=True)

    def cache_entry(self) -> Entry | None:
        """What the compile cache keeps of this model; None for constants that no fixed
        bytes hold (strings)."""
        if any(array.dtype.kind in "OUS" for array in self.constants.values()):
            return None
        extra = {"memory": dataclasses.asdict(self.memory_use), "tuned": list(self.tuned)}
        return Entry(self.abi, self.jit.objects, self.constants, extra)

    @property
    def program(self) -> Program:
        return self._build().program

    @property
    def schedules(self) -> tuple[KernelSchedule, ...]:
        return self._build().schedules

    @property
    def layout(self) -> Layout:
        return self._build().layout

    @property
    def symbols(self) -> tuple[str, ...]:
        return self._build().symbols

    def _build(self) -> Build:
        if self.build is None:
            raise PolyonnxError(
                "this model was loaded from the compile cache: its Program and schedules are "
                "not kept; compile it with cache=False to inspect them"
            )
        return self.build

    def memory(self) -> MemoryUse:
        """The bytes of the arena (and its lower bound) and of the constants."""
        return self.memory_use

    def set_threads(self, count: int) -> None:
        """How many threads the model's parallel loops use (if it has any)."""
        self.threads = max(int(count), 1)
        set_jit_threads(self.jit, count)

    def kernel_profile(self) -> list[KernelProfile]:
        """Per kernel, in execution order: the time its calls took (summed) and their count."""
        counters = self._profile_counters()
        with self._lock:
            nanos, calls = counters[:, 0].copy(), counters[:, 1].copy()
        total = int(nanos.sum())
        return [
            KernelProfile(
                kernel=kernel.name,
                op_type=kernel.op_type,
                seconds=int(ns) * 1e-9,
                calls=int(count),
                share=int(ns) / total if total else 0.0,
                multiply_adds=kernel.multiply_adds,
            )
            for kernel, ns, count in zip(self.abi.kernels, nanos, calls, strict=True)
        ]

    def reset_profile(self) -> None:
        """Zero every kernel's time and call count."""
        counters = self._profile_counters()
        with self._lock:
            counters[:] = 0

    def _profile_counters(self) -> np.ndarray:
        if self._counters is None:
            raise PolyonnxError(
                "this model was compiled without profiling; compile it (or create the "
                "InferenceSession) with profile=True"
            )
        return self._counters

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs must already be validated: C-contiguous arrays of the right dtype/shape.
        A run whose code meets a bad value (an index out of range, an integer division by
        zero) raises RunError and returns nothing."""
        results: dict[str, np.ndarray] = {}
        slots = self._slots
        with self._lock:  # slots were listed once, in __post_init__
            for i, name in self._inputs:
                slots[i] = address(inputs[name])
            for i, name, shape, dtype in self._outputs:
                results[name], slots[i] = self._output_array(name, shape, dtype)
            self._entry(slots)
            site, value = int(self._errors[0]), int(self._errors[1])
            if site:
                self._errors[:] = 0
        if site:
            raise RunError(self.abi.failure(site, value))
        for name, source in self._passed:
            given = inputs.get(source)
            results[name] = np.array(given if given is not None else self.constants[source])
        return results

    @property
    def copies_outputs(self) -> bool:
        """Whether some output is an input or a constant, copied rather than computed."""
        return bool(self._passed)

    def run_samples(
        self, arrays: Mapping[str, tuple[np.ndarray, int]], count: int, groups: int = 1
    ) -> None:
        """Run ``count`` times on ``arrays`` (every input and output: name -> the array and
        how many bytes on it the n-th run starts), the n-th at n times that: a batch run one
        sample at a time where each sample's data is contiguous (runtime/blocks.py). The
        first multiple of ``groups`` samples run that many at once (runtime/side_by_side.py),
        the rest one after another. Outputs the model copies (``_passed``) are not written;
        a failed check raises RunError."""
        ports = [(i, name) for i, name in self._inputs]
        ports += [(i, name) for i, name, _, _ in self._outputs]
        bases = [(i, address(arrays[name][0]), arrays[name][1]) for i, name in ports]
        whole = count - count % groups if groups > 1 and pool_available() else 0
        with self._lock:
            if whole:
                self._side_by_side(groups, bases, whole)
            self._one_by_one(bases, whole, count)

    def _side_by_side(self, groups: int, bases, count: int) -> None:
        side = self._groups.get(groups)
        if side is None:
            side = self._groups[groups] = SideBySide(self, groups, self._poison)
        failed = side.run(self._slots, bases, count)
        if failed:
            raise RunError(self.abi.failure(*failed))

    def _one_by_one(self, bases, first: int, count: int) -> None:
        slots = self._slots
        for n in range(first, count):
            for i, base, step in bases:
                slots[i] = base + n * step
            self._entry(slots)
            site, value = int(self._errors[0]), int(self._errors[1])
            if site:
                self._errors[:] = 0
                raise RunError(self.abi.failure(site, value))

    def _output_array(self, name: str, shape, dtype) -> tuple[np.ndarray, int]:
        """An array for output ``name`` and its address: a kept one that only the model
        references, or a new one, kept in place of the oldest (see ``KEPT_OUTPUTS``)."""
        kept = self._kept[name]
        for pair in kept:
            array, at = pair
            # references: the kept pair, ``array`` and getrefcount's argument; any other
            # (the caller's result, a memoryview) means the array is in use. Its memory is
            # a view of a bigger byte array (aligned_empty), which views of the result
            # reference in its place: that one's only reference must be array.base
            if sys.getrefcount(array) == 3 and sys.getrefcount(array.base) == 2:
                break
        else:
            array = aligned_empty(shape, dtype)
            at = address(array)
            kept.append((array, at))
            if len(kept) > KEPT_OUTPUTS:
                del kept[0]
        if self._poison:
            array.reshape(-1).view(np.uint8).fill(0xFF)  # reshape: a 0-d array too
        return array, at


def set_jit_threads(jit: JitModule, count: int) -> None:
    """How many threads the parallel loops of ``jit``'s code use (if it has any)."""
    address = jit.global_address(THREADS_GLOBAL)
    if address is not None and pool_runtime() is not None:
        ctypes.c_int32.from_address(address).value = max(int(count), 1)


def address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's data: through ctypes' buffer view where the
    array is writable and not empty, several times faster than ``array.ctypes.data`` (a run
    of a small model takes an address per input and output; docs/measurements.md, 'An
    array's address')."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):  # read-only, or no bytes
        return array.ctypes.data


def multiply_adds(kernel: Kernel) -> int:
    """The multiply-adds one run of ``kernel`` does: the points of its contraction
    statements (``reduce == "add"`` of a product), padding excluded."""
    return sum(
        count_points(stmt.domain)
        for stmt in kernel.statements
        if stmt.reduce == "add" and isinstance(stmt.expr, Binary) and stmt.expr.op == "mul"
    )


@lru_cache(maxsize=4096)
def count_points(domain: str) -> int:
    """The exact number of integer points of a bounded isl set without parameters.

    Dims that no constraint ties together are counted apart and the counts multiplied: a
    padded convolution's 7-d domain costs a few counts of (output, kernel offset) pairs,
    not a scan of its hundred million points."""
    pieces = parse_set(domain).make_disjoint().get_basic_sets()
    return sum(_count_basic_set(piece) for piece in pieces)


def _count_basic_set(piece: isl.BasicSet) -> int:
    if piece.dim(isl.dim_type.div):  # existentials may tie any dims: count as a whole
        return int(isl.Set.from_basic_set(piece).count_val().to_python())
    count = 1
    dims = piece.dim(isl.dim_type.set)
    for group in _independent_dims(piece):
        part = piece
        for d in reversed(range(dims)):
            if d not in group:
                part = part.project_out(isl.dim_type.set, d, 1)
        count *= int(isl.Set.from_basic_set(part).count_val().to_python())
    return count


def _independent_dims(piece: isl.BasicSet) -> list[set[int]]:
    """The dims of ``piece`` grouped so that no constraint involves two groups."""
    groups = [{d} for d in range(piece.dim(isl.dim_type.set))]
    for constraint in piece.get_constraints():
        tied = [
            g for g in groups if any(constraint.involves_dims(isl.dim_type.set, d, 1) for d in g)
        ]
        if len(tied) > 1:
            groups = [g for g in groups if g not in tied] + [set().union(*tied)]
    return groups
