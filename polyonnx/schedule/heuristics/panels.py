"""B packed once, when compiling: a GEMM (schedule/gemm.py) whose B is a constant of the model
(a Gemm's or a MatMul's weights) reads it from a copy laid out as the micro-kernel reads a
packed panel, instead of packing B at every call or reading it in place a row at a time.

The copy ``<B>.panels<NR>`` is a float32 constant of shape (ceil(N / NR), K, NR): column j
of row k at ``[j // NR, k, j % NR]``, zero past N. A tile of NR columns starting at column
``col`` (a multiple of NR) and K block ``kc`` is then the run of KC x NR floats at
``col * K + kc * NR``, the layout emit/ukernel.py packs into each call's panel.

Packed once, the MLP example and single Gemms measured faster than B read in place or
packed at every call, on a Zen 5 (docs/measurements.md, 'B packed once when compiling').

Only kernels with one ukernel mark qualify, and only where B is a whole constant (no
outer dim moves it, no domain constraint cuts it), the GEMM has at least MIN_ROWS rows
(a one-row GEMM reads B in place, slices side by side) and NC is a multiple of NR. The
original constant stays: other kernels, or the model's outputs, may read it. Where none
does (``panel_only``), its bytes are not kept: its slot holds the copy, never read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from polyonnx.aligned import aligned_empty
from polyonnx.krnl.ir import Buffer, Program, statement_reads
from polyonnx.schedule.gemm import Geometry, Params, geometry
from polyonnx.schedule.heuristics.gemm_defaults import default_params, panel_blocks
from polyonnx.schedule.state import UKERNEL
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.target import Target, host_target

MIN_ROWS = 2
MARK = re.compile(rf"{UKERNEL}_\w+")
"""A ukernel mark in a schedule tree's text (Params.mark's words joined by ``_``)."""


def panel_name(buffer: str, nr: int) -> str:
    return f"{buffer}.panels{nr}"


def pack_constants(
    program: Program, schedules: tuple[KernelSchedule, ...], target: Target | None = None
) -> tuple[Program, tuple[KernelSchedule, ...]]:
    """``program`` with the panel copies of its GEMMs' constant B operands, and the
    schedules of those GEMMs with ``panels`` naming them (a default schedule's with the
    K and N blocks of a copy, gemm_defaults.panel_blocks, for ``target``: the host by
    default)."""
    target = target or host_target()
    constants = dict(program.constants)
    buffers = dict(program.buffers)
    made: dict[tuple, str] = {}
    out = []
    for schedule in schedules:
        found = _packable(schedule, program)
        if found is None:
            out.append(schedule)
            continue
        geo, params, data = found
        blocks = _blocks(geo, params, target)
        schedule = _remarked(schedule, params, blocks)
        params = blocks
        layout = [(geo.sizes[d], geo.b.coeffs[d]) for d in (*geo.depth, *geo.cols)]
        key = (geo.b.buffer, geo.b.const, len(geo.depth), *layout, params.nr)
        if key not in made:  # B read another way gets another copy
            name = panel_name(geo.b.buffer, params.nr)
            while name in constants:
                name += "_"
            made[key] = name
            constants[name] = panel_array(data, geo, params.nr)
            buffers[name] = Buffer(name, constants[name].shape, "float32")
        out.append(replace(schedule, panels=((geo.b.buffer, made[key]),)))
    if len(constants) == len(program.constants):
        return program, tuple(out)
    packed = replace(
        program, constants=MappingProxyType(constants), buffers=MappingProxyType(buffers)
    )
    return packed, tuple(out)


def _blocks(geo: Geometry, params: Params, target: Target) -> Params:
    """The default's parameters with the K and N blocks of a panel copy; any others (a
    script's, a record's) as they are."""
    lanes, registers = target.lanes(4), target.vector_registers
    if not all(isinstance(n, int) for n in geo.sizes):
        return params  # a parametric GEMM: its defaults are for REPRESENTATIVE_ROWS
    if params != default_params(geo, lanes, registers):
        return params
    return panel_blocks(geo, params, lanes, registers)


def _remarked(schedule: KernelSchedule, old: Params, new: Params) -> KernelSchedule:
    """``schedule`` with its ukernel mark of ``old`` parameters made ``new``'s."""
    if new == old:
        return schedule
    was, now = old.mark(), new.mark()
    state = schedule.state
    if state is not None:
        marks = {loop: frozenset(now if m == was else m for m in ms)
                 for loop, ms in state.marks.items()}  # fmt: skip
        state = replace(state, marks=MappingProxyType(marks))
    return replace(schedule, tree=schedule.tree.replace(was, now), state=state)


def panel_only(program: Program, schedules: Sequence[KernelSchedule]) -> dict[str, str]:
    """The constants that code reads only through a panel copy, each to that copy: the
    GEMM statement of a packed kernel is their one reader, and no output is one."""
    readers: dict[str, list[tuple[KernelSchedule, int]]] = {}
    for schedule in schedules:
        for index, stmt in enumerate(schedule.kernel.statements):
            for name in statement_reads(stmt):
                root = program.root(name)
                if root in program.constants:
                    readers.setdefault(root, []).append((schedule, index))
    outputs = {program.root(o) for o in program.outputs}
    found = {}
    for root, uses in readers.items():
        copies = [_copy_of(s, root, program) for s, _ in uses]
        kernels = [id(s) for s, _ in uses]
        if root in outputs or None in copies or len(set(kernels)) != len(kernels):
            continue
        found[root] = copies[0]
    return found


def _copy_of(schedule: KernelSchedule, root: str, program: Program) -> str | None:
    for b, copy in schedule.panels:
        if program.root(b) == root:
            return copy
    return None


def _packable(schedule: KernelSchedule, program: Program):
    """(geometry, parameters, B's root constant flattened from B's first element) of the
    schedule's GEMM when its B can be packed once, else None."""
    marks = set(MARK.findall(schedule.tree))
    if len(marks) != 1:
        return None
    params = Params.from_mark(marks.pop())
    found = [g.geo for g in schedule.gemms] or [
        geometry(s, program.buffers) for s in schedule.kernel.statements
    ]
    found = [g for g in found if g is not None]
    if len(found) != 1:
        return None
    geo = found[0]
    if not packs_once(geo, program) or params.nc % params.nr:
        return None
    data = program.constants[program.root(geo.b.buffer)]
    start = program.offset(geo.b.buffer) // 4 + geo.b.const
    return geo, params, np.ascontiguousarray(data).reshape(-1)[start:]


def packs_once(geo: Geometry, program: Program) -> bool:
    """Whether compiling packs this GEMM's B (given an NC that is a multiple of NR): a
    float32 constant that no outer dim moves and no constraint cuts, and MIN_ROWS rows."""
    data = program.constants.get(program.root(geo.b.buffer))
    if data is None or data.dtype != np.float32 or geo.constraints:
        return False
    rows = geo.m if isinstance(geo.m, int) else MIN_ROWS  # a parametric count: any
    return not any(geo.b.coeffs[d] for d in geo.outer) and rows >= MIN_ROWS


def panel_array(flat: np.ndarray, geo: Geometry, nr: int) -> np.ndarray:
    """B as (ceil(N / NR), K, NR) panels (module docstring); ``flat`` starts at B's element
    (k = 0, n = 0). Gathered a panel at a time, so the index arrays stay K x NR (a 25088 x
    4096 weight would take 800 MB of indices at once)."""
    rows = _offsets(geo, geo.depth)
    cols = _offsets(geo, geo.cols)
    panels = -(-geo.n // nr)
    out = aligned_empty((panels, geo.k, nr), np.float32)
    for p in range(panels):
        width = min(nr, geo.n - p * nr)
        out[p, :, :width] = flat[rows[:, None] + cols[None, p * nr : p * nr + width]]
        out[p, :, width:] = 0
    return out


def _offsets(geo: Geometry, dims: tuple[int, ...]) -> np.ndarray:
    """B's element offsets along the flattening of ``dims`` (outermost first)."""
    total = np.zeros(1, np.int64)
    for d in dims:
        step = np.arange(geo.sizes[d], dtype=np.int64) * geo.b.coeffs[d]
        total = (total[:, None] + step[None, :]).reshape(-1)
    return total
