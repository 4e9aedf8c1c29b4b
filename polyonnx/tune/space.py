"""A kernel's search space: its tunable knobs are the parameters of schedule-trace steps.

A point of the space (a *genome*) maps each knob to a value; :meth:`Space.trace` turns
it into the trace that the worker replays, and that the database stores.

- A contraction (packed GEMM, schedule/heuristics/ukernel.py): the micro-kernel's MR,
  NR, KC, MC, NC, K unroll, thread split, A/B packing and, for batches, a parallel batch loop:
  ``[ukernel(mr=.., nr=.., ...), parallel(n_g)]``.
- Any other kernel: the default heuristic's schedule or another loop order of its main
  statement (vectorising the new innermost loop), then optionally its outermost loop on
  threads and one loop unrolled: ``[default(), parallel(d0), unroll(d1, 4)]``.

Values that cannot help are left out (a K block larger than K); values that are illegal
for this kernel stay in: the schedule API refuses them, with a reason, and the trial is
recorded as failed.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel
from polyonnx.krnl.islutil import dim_names, extents
from polyonnx.schedule.gemm import Geometry, geometry
from polyonnx.schedule.gemm_taps import b_row_stride, b_taps
from polyonnx.schedule.heuristics.gemm_defaults import default_params, vector_registers
from polyonnx.schedule.heuristics.panels import packs_once
from polyonnx.schedule.schedule import Schedule
from polyonnx.schedule.state import PARALLEL

Genome = dict[str, object]

MAX_ORDERS = 24
"""Loop orders offered for a kernel that is not a GEMM (its main statement's loops)."""


@dataclass(frozen=True)
class Space:
    """The knobs of one kernel and their values; the default genome is one of them."""

    kind: str
    """"gemm" or "loops"."""
    kernel: str
    knobs: dict[str, tuple]
    default: Genome
    geometry: Geometry | None = None
    lanes: int = 16
    default_loops: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """For "loops": the default schedule's wide loops (threads go on the first) and its
    main nest's loops, outermost first."""

    def size(self) -> int:
        return math.prod(len(v) for v in self.knobs.values())

    def sample(self, rng: random.Random) -> Genome:
        return {name: rng.choice(values) for name, values in self.knobs.items()}

    def mutate(self, genome: Genome, rng: random.Random, changes: int = 1) -> Genome:
        child = dict(genome)
        movable = [n for n, v in self.knobs.items() if len(v) > 1]
        for name in rng.sample(movable, min(changes, len(movable))):
            values = self.knobs[name]
            if name in ORDERED and child[name] in values:  # a step to a neighbour
                i = values.index(child[name]) + rng.choice((-1, 1))
                child[name] = values[min(max(i, 0), len(values) - 1)]
            else:
                child[name] = rng.choice(values)
        return child

    def crossover(self, a: Genome, b: Genome, rng: random.Random) -> Genome:
        return {name: (a if rng.random() < 0.5 else b)[name] for name in self.knobs}

    def trace(self, genome: Genome) -> list[dict]:
        return gemm_trace(self, genome) if self.kind == "gemm" else loops_trace(self, genome)

    def features(self, genome: Genome) -> list[float]:
        """Numbers the cost model fits the (log) time on."""
        if self.kind == "gemm":
            return gemm_features(self, genome)
        values = []
        for name, choices in self.knobs.items():
            values += [float(genome[name] == c) for c in choices[1:]]  # one-hot, first dropped
        return values


ORDERED = frozenset({"mr", "nr", "kc", "mc", "nc", "unroll", "factor"})


def space_for(
    kernel: Kernel, buffers: Mapping[str, Buffer], threads: int, lanes: int, program=None
) -> Space:
    """The GEMM space for a kernel the micro-kernel can run, else the loops space. With
    the ``program``, a GEMM whose B compiling packs once (schedule/heuristics/panels.py) keeps its
    default ``packb``: either value runs the same code."""
    found = [g for g in (geometry(s, buffers) for s in kernel.statements) if g is not None]
    if len(found) == 1 and _ukernel_ok(kernel, buffers):
        space = gemm_space(kernel, found[0], threads, lanes)
        if program is not None and packs_once(found[0], program):
            space.knobs["packb"] = (space.default["packb"],)
        return space
    return loops_space(kernel, buffers, threads)


def _ukernel_ok(kernel: Kernel, buffers: Mapping[str, Buffer]) -> bool:
    try:
        Schedule(kernel, buffers).ukernel()
    except ScheduleError:
        return False
    return True


# ---- contractions ------------------------------------------------------------------------


def gemm_space(kernel: Kernel, geo: Geometry, threads: int, lanes: int) -> Space:
    """Register tiles that fit the registers and the problem, cache blocks up to just
    past the extents, and the thread splits when there are threads to split over."""
    registers = vector_registers(lanes)
    base = default_params(geo, lanes, registers)
    nrs = tuple(n for n in (lanes, 2 * lanes, 3 * lanes, 4 * lanes) if n <= _up(geo.n, lanes))
    mrs = tuple(m for m in (1, 2, 4, 6, 8, 10, 12, 14, 16) if m <= geo.m) or (geo.m,)
    taps = b_taps(geo)
    window = taps.count if taps is not None else 1  # in place, K blocks are whole windows
    kcs = tuple(sorted({_up(c, window) for c in (16, 32, 64, 96, 128, 192, 256, 384, 512, 768)}))
    knobs: dict[str, tuple] = {
        "mr": mrs,
        "nr": nrs or (lanes,),
        "kc": _upto(kcs, geo.k, base.kc),
        "mc": _upto((8, 16, 32, 64, 128, 256), geo.m, base.mc),
        "nc": _upto((64, 128, 256, 384, 512, 768, 1024, 2048), geo.n, base.nc),
        "unroll": (1, 2, 4, 8),
        "split": ("none", "rows", "cols") if threads > 1 else ("none",),
        "packa": (0, 1),
        "prefetch": (0, 1),
        "packb": (0, 1) if b_row_stride(geo) is not None or taps is not None else (1,),
    }
    batches = [geo.dims[d] for d in geo.outer if geo.sizes[d] >= 2]
    knobs["batch_threads"] = (0, 1) if batches and threads > 1 else (0,)
    default = {
        "mr": base.mr, "nr": base.nr, "kc": base.kc, "mc": base.mc, "nc": base.nc,
        "unroll": base.unroll, "split": base.split, "packa": base.packa,
        "prefetch": base.prefetch, "packb": base.packb, "batch_threads": 0,
    }  # fmt: skip
    for name, value in default.items():  # the default is always a point of the space
        if value not in knobs[name]:
            knobs[name] = tuple(sorted({*knobs[name], value}, key=_order_key))
    return Space("gemm", kernel.name, knobs, default, geo, lanes)


def _up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _upto(choices: tuple[int, ...], extent: int, default: int) -> tuple[int, ...]:
    """The choices below ``extent``, the first at or above it, and the default."""
    kept = [c for c in choices if c < extent]
    kept += [c for c in choices if c >= extent][:1]
    return tuple(sorted({*kept, default}))


def _order_key(value: object) -> tuple:
    return (isinstance(value, str), value)


def gemm_trace(space: Space, genome: Genome) -> list[dict]:
    params = {
        k: genome[k]
        for k in ("mr", "nr", "kc", "mc", "nc", "unroll", "split", "packa", "prefetch", "packb")
    }
    trace = [{"kernel": space.kernel, "primitive": "ukernel", "args": {"params": params}}]
    if genome.get("batch_threads") and genome["split"] == "none":
        geo = space.geometry
        batch = next(geo.dims[d] for d in geo.outer if geo.sizes[d] >= 2)
        trace.append(
            {"kernel": space.kernel, "primitive": "parallel", "args": {"loop": f"{batch}_g"}}
        )
    return trace


def gemm_features(space: Space, genome: Genome) -> list[float]:
    geo = space.geometry
    mr, nr, kc, mc, nc = (int(genome[k]) for k in ("mr", "nr", "kc", "mc", "nc"))
    kc_eff, mc_eff, nc_eff = min(kc, geo.k), min(mc, geo.m), min(nc, geo.n)
    waste_m = _up(geo.m, mr) / geo.m - 1
    waste_n = _up(geo.n, nr) / geo.n - 1
    waste_k = _up(geo.k, kc_eff) / geo.k - 1
    accumulators = mr * nr / space.lanes
    return [
        math.log2(mr), math.log2(nr), math.log2(kc_eff), math.log2(mc_eff), math.log2(nc_eff),
        math.log2(int(genome["unroll"])), waste_m, waste_n, waste_k,
        accumulators / 32, float(accumulators > 28),
        math.log2(kc_eff * nc_eff * 4) - 20,  # packed B block against L2 (1 MB)
        math.log2(kc_eff * nr * 4) - 15,  # a B micro-panel against L1 (32 KB)
        float(genome["split"] == "rows"), float(genome["split"] == "cols"),
        float(genome["packa"]), float(genome["packb"]), float(genome["batch_threads"]),
        float(genome["prefetch"]),
        float(genome["split"] != "none") * math.log2(max(geo.n / nc_eff, 1.0)),
        float(genome["split"] != "none") * math.log2(max(geo.m / mc_eff, 1.0)),
    ]  # fmt: skip


# ---- other kernels -----------------------------------------------------------------------


def loops_space(kernel: Kernel, buffers: Mapping[str, Buffer], threads: int) -> Space:
    """The default schedule or another loop order, then threads and an unrolled loop."""
    schedule = Schedule(kernel, buffers)
    schedule.default()
    state = schedule.state
    main = max(kernel.statements, key=lambda s: len(dim_names(s)))
    sizes = dict(zip(dim_names(main), extents(main), strict=True))
    nest = max(state.nests, key=lambda n: len(n.loops))
    wide = [v.name for v in nest.loops if sizes.get(v.expr, 2) >= 2]  # else a merged loop
    orders = _orders(main, sizes, nest.loops[-1].expr if nest.loops else None)
    already = any(state.marked(name, PARALLEL) for name in state.loop_names())
    knobs: dict[str, tuple] = {
        "base": ("default", *(",".join(o) for o in orders)),
        "threads": (0, 1) if threads > 1 and not already and wide else (0,),
        "unroll": (0, 2, 3) if len(nest.loops) >= 2 else (0,),
        "factor": (2, 4, 8),
    }
    default = {"base": "default", "threads": 0, "unroll": 0, "factor": 2}
    return Space("loops", kernel.name, knobs, default, default_loops=(tuple(wide), nest.names()))


def _orders(main, sizes: Mapping[str, int], innermost: str | None) -> list[tuple[str, ...]]:
    """Loop orders of the main statement's dims (those of extent 1 left out) other than
    the original one: those ending with the default's innermost (SIMD) dim first, then,
    for few dims, the others; at most MAX_ORDERS."""
    dims = [d for d in dim_names(main) if sizes[d] > 1]
    if not 2 <= len(dims) <= 6:
        return []
    inner = innermost if innermost in dims else dims[-1]
    rest = [d for d in dims if d != inner]
    orders = [(*p, inner) for p in itertools.permutations(rest)]
    if len(dims) <= 4:
        orders += [p for p in itertools.permutations(dims) if p[-1] != inner]
    return [o for o in orders if o != tuple(dims)][:MAX_ORDERS]


def loops_trace(space: Space, genome: Genome) -> list[dict]:
    """``unroll`` counts loops from the innermost (2: the one just outside it)."""
    name = space.kernel
    base = str(genome["base"])
    if base == "default":
        trace = [{"kernel": name, "primitive": "default", "args": {}}]
        wide, loops = space.default_loops
    else:
        loops = wide = tuple(base.split(","))
        trace = [
            {"kernel": name, "primitive": "reorder", "args": {"loops": list(loops)}},
            {"kernel": name, "primitive": "vectorize", "args": {"loop": loops[-1]}},
        ]
    position = int(genome["unroll"])
    unrolled = loops[-position] if position and position <= len(loops) else None
    if unrolled is not None:
        factor = genome["factor"]
        trace.append(
            {"kernel": name, "primitive": "unroll", "args": {"loop": unrolled, "factor": factor}}
        )
    if genome["threads"]:  # after the unroll: a parallel loop cannot be split
        outer = f"{wide[0]}_o" if wide[0] == unrolled else wide[0]
        trace.append({"kernel": name, "primitive": "parallel", "args": {"loop": outer}})
    return trace


def genome_of(space: Space, trace: list[dict]) -> Genome | None:
    """The point of ``space`` whose trace is ``trace`` (one read back from the database),
    or None when no point gives it."""
    genome: Genome | None = None
    if space.kind == "gemm" and trace and trace[0]["primitive"] == "ukernel":
        genome = {**trace[0]["args"]["params"]}
        genome["batch_threads"] = int(any(s["primitive"] == "parallel" for s in trace))
    elif space.kind == "loops" and trace:
        genome = dict(space.default)
        if trace[0]["primitive"] == "reorder":
            genome["base"] = ",".join(trace[0]["args"]["loops"])
        loops = space.default_loops[1] if genome["base"] == "default" else genome["base"].split(",")
        for step in trace:
            if step["primitive"] == "parallel":
                genome["threads"] = 1
            if step["primitive"] == "unroll" and step["args"]["loop"] in loops:
                genome["unroll"] = len(loops) - list(loops).index(step["args"]["loop"])
                genome["factor"] = step["args"]["factor"]
    if genome is None or set(genome) != set(space.knobs):
        return None
    return genome if space.trace(genome) == trace else None
