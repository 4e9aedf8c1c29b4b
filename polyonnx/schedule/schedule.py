"""The schedule scripting API: loop handles and primitives with exact, explained legality.

    s = prog.schedule("mm")
    i, j, k = s.loops
    io, ii = s.split(i, 32)
    s.reorder(io, k, ii, j)
    s.vectorize(j)
    print(s)              # the loop nest as pseudo-C
    s.trace               # the steps, as JSON-able data, replayable with s.apply(trace)

Every primitive computes a new state, checks it against the kernel's dependences (isl),
and only then replaces the schedule's state; an illegal step raises ScheduleError and
leaves the schedule as it was.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import islpy as isl

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel
from polyonnx.schedule.astgen import kernel_parameters
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.heuristics.ukernel import ukernel_state
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.primitives import annotate, fuse
from polyonnx.schedule.primitives.pack import pack as pack_buffer
from polyonnx.schedule.primitives.reorder import reorder as reorder_loops
from polyonnx.schedule.primitives.split import is_int
from polyonnx.schedule.primitives.split import split as split_loop
from polyonnx.schedule.state import State
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.target import host_target


@dataclass(frozen=True)
class Loop:
    """A handle on a loop of a schedule, by name."""

    name: str

    def __str__(self) -> str:
        return self.name


LoopArg = Loop | str


class Schedule:
    def __init__(self, kernel: Kernel, buffers: Mapping[str, Buffer], state: State | None = None):
        self.kernel = kernel
        self.buffers = dict(buffers)
        self.state = state or State.original(kernel)
        self._trace: list[dict[str, Any]] = []
        self._deps: tuple[Kernel, isl.UnionMap] | None = None
        self._reference: State | None = None
        """After a pack, the schedule that defines the kernel's meaning (None: the
        original statement order)."""

    # ---- reading ------------------------------------------------------------------------

    @property
    def loops(self) -> tuple[Loop, ...]:
        """The loops of the kernel's main statement (its last, widest one), outermost first."""
        widest = max(self.state.nests, key=lambda n: (len(n.loops), self.state.nests.index(n)))
        return tuple(Loop(name) for name in widest.names())

    @property
    def trace(self) -> list[dict[str, Any]]:
        return [dict(step) for step in self._trace]

    def kernel_schedule(self) -> KernelSchedule:
        return self.state.to_kernel_schedule()

    def __str__(self) -> str:
        from polyonnx.schedule.pseudo_c import pseudo_c

        return pseudo_c(self.kernel_schedule(), self.all_buffers(), self.state)

    @property
    def deps(self) -> isl.UnionMap:
        """Dependences of the kernel as the schedule has it now (pack adds statements)."""
        kernel = self.state.kernel
        if self._deps is None or self._deps[0] is not kernel:
            order = self._reference.isl_schedule().get_map() if self._reference else None
            self._deps = (kernel, dependences(kernel, order))
        return self._deps[1]

    def all_buffers(self) -> dict[str, Buffer]:
        return {**self.buffers, **self.state.scratch}

    # ---- primitives ---------------------------------------------------------------------

    def split(self, loop: LoopArg, factor: int) -> tuple[Loop, Loop]:
        name = self._name(loop, "split")
        state, outer, inner = split_loop(self.state, name, factor)
        self._commit(state, "split", name, {"loop": name, "factor": factor})
        return Loop(outer), Loop(inner)

    def tile(self, *loops: LoopArg, sizes: Sequence[int]) -> tuple[Loop, ...]:
        """Split each loop by its size, then order all outer loops before all inner ones."""
        names = [self._name(loop, "tile") for loop in loops]
        if not isinstance(sizes, list | tuple) or len(sizes) != len(names):
            raise ScheduleError(f"tile({', '.join(names)}): give one size per loop, got {sizes}")
        state, outers, inners = self.state, [], []
        for name, size in zip(names, sizes, strict=True):
            state, outer, inner = split_loop(state, name, size)
            outers.append(outer)
            inners.append(inner)
        state = reorder_loops(state, [*outers, *inners])
        self._commit(state, "tile", ", ".join(names), {"loops": names, "sizes": list(sizes)})
        return tuple(Loop(n) for n in [*outers, *inners])

    def reorder(self, *loops: LoopArg) -> None:
        names = [self._name(loop, "reorder") for loop in loops]
        state = reorder_loops(self.state, names)
        self._commit(state, "reorder", ", ".join(names), {"loops": names})

    def vectorize(self, loop: LoopArg) -> None:
        name = self._name(loop, "vectorize")
        self._commit(
            annotate.vectorize(self.state, self.deps, name), "vectorize", name, {"loop": name}
        )

    def unroll(self, loop: LoopArg, factor: int | None = None) -> None:
        """Unroll fully, or by ``factor`` (split, then unroll the inner loop)."""
        name = self._name(loop, "unroll")
        if factor is not None and (not is_int(factor) or factor < 1):
            raise ScheduleError(
                f"unroll({name}, {_shown(factor)}): the factor must be a positive int or None"
            )
        state = self.state
        target = name
        if factor is not None:
            state, _, target = split_loop(state, name, factor)
        state = annotate.unroll(state, target)
        self._commit(state, "unroll", name, {"loop": name, "factor": factor})

    def parallel(self, loop: LoopArg) -> None:
        name = self._name(loop, "parallel")
        self._commit(
            annotate.parallel(self.state, self.deps, name), "parallel", name, {"loop": name}
        )

    def ukernel(self, **params: Any) -> None:
        """Run the kernel's contraction as packed, cache-tiled GEMM with an MR x NR register
        tile (schedule/heuristics/ukernel.py): ``mr``, ``nr`` (a multiple of the SIMD
        width), ``kc``, ``mc``, ``nc``, ``unroll`` (of the K loop) and ``split`` ("none", "rows" or
        "cols": how threads share one GEMM). Unnamed parameters take the default's values.
        Precondition: one statement is a float32 contraction whose left operand is
        contiguous along the reduction, and its loops are still untransformed."""
        self._sized("ukernel")
        host = host_target()
        state = ukernel_state(
            self.state, self.buffers, params, host.lanes(4), host.vector_registers
        )
        self._commit(state, "ukernel", "", {"params": dict(params)})

    def default(self) -> None:
        """Start over from the default heuristic's schedule (what an unscheduled kernel
        gets: packed GEMM, row fusion, stencil or plain nests, with their threads), so
        that later steps refine it. The tuner's candidates for kernels that are not GEMMs
        begin with this step."""
        self._sized("default")
        chosen = default_schedule(self.kernel, self.buffers)  # the host's
        if chosen.state is None:
            raise ScheduleError(f"default(): kernel {self.kernel.name!r} has no default state")
        self._commit(chosen.state, "default", "", {})

    def pack(self, buffer: str, at: LoopArg) -> None:
        """Copy the region of ``buffer`` that the loops inside ``at`` read into a contiguous
        scratch buffer, once per iteration of ``at``, and read it from there. The copies
        keep every dependence (only a read-only input is copied, right before the loops
        that read it); from then on the packed order is the reference that later steps
        must respect. Refused inside a parallel loop, whose threads would share the one
        scratch buffer, and inside a vectorized loop, which the copy would leave no longer
        innermost."""
        loop = self._name(at, "pack")
        if not isinstance(buffer, str) or buffer not in self.buffers:
            raise ScheduleError(
                f"pack({buffer!r}, at={loop}): kernel {self.kernel.name!r} has no buffer {buffer!r}"
            )
        state = pack_buffer(self.state, self.all_buffers(), buffer, loop)
        args = {"buffer": buffer, "at": loop}
        self._commit(state, "pack", f"{buffer!r}, at={loop}", args, reference=True)

    def compute_at(self, name: str, loop: LoopArg) -> None:
        """Run kernel ``name``'s statements (or the one statement ``name``) inside ``loop``
        of the statements before them, after that loop's inner loops, aligned to the
        iteration that produces or consumes their data."""
        target = self._name(loop, "compute_at")
        if not isinstance(name, str):
            raise ScheduleError(
                f"compute_at({_shown(name)}, {target}): name a kernel or statement (a str)"
            )
        prefix = re.sub(r"\W", "_", name) + "_"
        guests = [
            s.name for s in self.kernel.statements if s.name == name or s.name.startswith(prefix)
        ]
        if not guests:
            known = sorted({s.name.rsplit("_S", 1)[0] for s in self.kernel.statements})
            raise ScheduleError(
                f"compute_at({name!r}, {target}): no such kernel here; kernels: {known}"
            )
        state = fuse.compute_at(self.state, guests, target)
        self._commit(state, "compute_at", target, {"name": name, "loop": target})

    # ---- traces -------------------------------------------------------------------------

    def apply(self, trace: Sequence[Mapping[str, Any]]) -> None:
        """Replay the steps of a trace (from ``s.trace``) on this schedule; a malformed
        step raises ScheduleError naming it (the steps before it stay applied)."""
        for position, step in enumerate(trace_steps(trace)):
            primitive, args = step_call(step, position)
            REPLAY[primitive].call(self, args, f"trace step {position} ({primitive})")

    # ---- internals ----------------------------------------------------------------------

    def _sized(self, primitive: str) -> None:
        """Refuse a step that chooses from sizes on a kernel whose sizes are isl
        parameters (a parametric program's)."""
        params = kernel_parameters(self.kernel.statements)
        if params:
            raise ScheduleError(
                f"{primitive}(): kernel {self.kernel.name!r} has run-time sizes (isl parameters "
                f"{', '.join(params)}); its micro-kernel and default come from the sizes it is "
                "lowered at (schedule/heuristics/parametric.py). Tune the model at a size: the "
                "records apply to its parametric code"
            )

    def _name(self, loop: LoopArg, primitive: str) -> str:
        if not isinstance(loop, Loop | str):
            raise ScheduleError(
                f"{primitive}: a loop is a Loop or a loop name (str), given "
                f"{type(loop).__name__} {_shown(loop)}"
            )
        name = loop.name if isinstance(loop, Loop) else loop
        if name not in self.state.loop_names():
            known = ", ".join(self.state.loop_names())
            raise ScheduleError(
                f"{primitive}({name}): kernel {self.kernel.name!r} has no loop {name!r}; "
                f"its loops are {known}"
            )
        return name

    def _commit(
        self,
        state: State,
        primitive: str,
        loop: str,
        args: dict[str, Any],
        *,
        reference: bool = False,
    ) -> None:
        """Replace the state by ``state`` if it keeps every dependence, else raise.
        ``reference``: the step adds statements whose order defines the kernel's meaning
        from now on (pack): it must keep the dependences of the order before it, and the
        loops marked earlier must stay legal under the dependences it adds."""
        problem = self._problem(state, reference)
        if problem is not None:
            raise ScheduleError(
                f"{primitive}({loop}) on kernel {self.kernel.name!r} {problem}. "
                f"The loop nest stays:\n{self}"
            )
        self.state = state
        if reference:
            self._reference = state
        self._trace.append({"kernel": self.kernel.name, "primitive": primitive, "args": args})

    def _problem(self, state: State, reference: bool) -> str | None:
        same = state.kernel is self.state.kernel
        deps = self.deps if same or reference else dependences(state.kernel)
        broken = broken_order(state, deps)
        if broken is not None:
            return f"would break a dependence: {broken} must stay in that order"
        if not reference:
            return None
        order = state.isl_schedule().get_map()
        return annotate.broken_marks(state, dependences(state.kernel, order))


@dataclass(frozen=True)
class Replay:
    """How a trace step calls its primitive: ``method`` of Schedule with the step's
    arguments by name; ``spread`` names the one argument the method takes as ``*loops``
    (a list) or ``**params`` (a dict)."""

    method: Callable[..., object]
    spread: str | None = None

    def call(self, schedule: Schedule, args: Mapping[str, Any], where: str) -> None:
        """Call the primitive with ``args``; ScheduleError naming ``where`` (the step) if
        they do not fit its parameters."""
        named, positional = dict(args), ()
        if self.spread is not None:
            if self.spread not in named:
                raise ScheduleError(f"{where}: its args need {self.spread!r}; given {_shown(args)}")
            spread = named.pop(self.spread)
            if self.spread == "params":
                if not isinstance(spread, Mapping) or not all(isinstance(k, str) for k in spread):
                    raise ScheduleError(
                        f"{where}: {self.spread!r} must be a mapping of names to values, "
                        f"given {_shown(spread)}"
                    )
                named.update(spread)
            elif isinstance(spread, list | tuple):
                positional = tuple(spread)
            else:
                raise ScheduleError(
                    f"{where}: {self.spread!r} must be a list of loop names, given {_shown(spread)}"
                )
        try:
            inspect.signature(self.method).bind(schedule, *positional, **named)
        except TypeError as error:
            wanted = [p for p in inspect.signature(self.method).parameters if p != "self"]
            raise ScheduleError(
                f"{where}: {error}; its args are {', '.join(wanted)}, given {_shown(args)}"
            ) from None
        self.method(schedule, *positional, **named)


def trace_steps(trace: object) -> list[Mapping[str, Any]]:
    """The steps of a trace, each checked to be a mapping; ScheduleError otherwise."""
    if isinstance(trace, str | bytes | Mapping) or not isinstance(trace, Sequence):
        raise ScheduleError(
            f"a trace is a list of steps (mappings with kernel, primitive and args), given "
            f"{type(trace).__name__} {_shown(trace)}"
        )
    for position, step in enumerate(trace):
        if not isinstance(step, Mapping):
            raise ScheduleError(
                f"trace step {position} must be a mapping with kernel, primitive and args, "
                f"given {type(step).__name__} {_shown(step)}"
            )
    return list(trace)


def step_call(step: Mapping[str, Any], position: int) -> tuple[str, Mapping[str, Any]]:
    """A step's primitive (one REPLAY knows) and its args (a mapping with str keys)."""
    primitive = step.get("primitive")
    if not isinstance(primitive, str) or primitive not in REPLAY:
        raise ScheduleError(
            f"trace step {position}: unknown primitive {_shown(primitive)} in {_shown(step)}; "
            f"the primitives are {', '.join(REPLAY)}"
        )
    args = step.get("args")
    if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
        raise ScheduleError(
            f"trace step {position} ({primitive}): 'args' must be a mapping of argument "
            f"names to values, given {_shown(args)}"
        )
    return primitive, args


def step_kernel(step: Mapping[str, Any], position: int) -> list[str]:
    """The kernel names a step's 'kernel' holds (joined by '+' for fused kernels)."""
    kernel = step.get("kernel")
    if not isinstance(kernel, str) or not kernel:
        raise ScheduleError(
            f"trace step {position}: 'kernel' must name a kernel (a str), given "
            f"{_shown(kernel)} in {_shown(step)}"
        )
    return kernel.split("+")


def _shown(value: object) -> str:
    """``repr(value)``, cut short: a hostile trace may hold anything."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."


REPLAY: Mapping[str, Replay] = MappingProxyType(
    {
        "split": Replay(Schedule.split),
        "tile": Replay(Schedule.tile, spread="loops"),
        "reorder": Replay(Schedule.reorder, spread="loops"),
        "vectorize": Replay(Schedule.vectorize),
        "unroll": Replay(Schedule.unroll),
        "parallel": Replay(Schedule.parallel),
        "ukernel": Replay(Schedule.ukernel, spread="params"),
        "default": Replay(Schedule.default),
        "pack": Replay(Schedule.pack),
        "compute_at": Replay(Schedule.compute_at),
    }
)
"""Every primitive a trace may name, by the name its step records (the method's name)."""
