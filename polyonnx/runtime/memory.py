"""Where every buffer lives: caller-provided slots for inputs, outputs and constants, and
one arena for intermediates, planned from tensor lifetimes (greedy best fit, largest
first) so that tensors that are never live at the same time share bytes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polyonnx.aligned import ALIGN
from polyonnx.krnl.ir import Program

ARENA = "<arena>"


@dataclass(frozen=True)
class Placement:
    slot: int
    offset: int


@dataclass(frozen=True)
class Layout:
    """``slots`` names what each pointer passed to the entry function holds: a buffer
    name, or ARENA (always last). ``places`` locates every buffer."""

    slots: tuple[str, ...]
    places: Mapping[str, Placement]
    arena_bytes: int
    lower_bound_bytes: int
    """The most bytes of intermediates live at any one kernel: no plan can do better."""


def external_slots(program: Program) -> tuple[list[str], dict[str, int]]:
    """The caller's buffers in slot order (inputs, outputs, constants) and, for each
    buffer that owns storage in one, its slot."""
    outputs = [o for o in program.outputs if o in program.buffers and o not in program.inputs]
    external = [*program.inputs, *dict.fromkeys(o for o in outputs if o not in program.constants)]
    external += [c for c in program.constants if c not in external]
    owner = {name: i for i, name in enumerate(external)}
    for out in outputs:  # an output owns the storage it is a view of
        root = program.root(out)
        if root not in owner and out in owner:
            owner[root] = owner[out]
    return external, owner


def plan_memory(program: Program) -> Layout:
    external, owner = external_slots(program)
    slots = (*external, ARENA)
    places: dict[str, Placement] = {}
    arena_roots: dict[str, int] = {}
    for name in program.buffers:
        root = program.root(name)
        if root in owner:
            places[name] = Placement(owner[root], program.offset(name))
        else:
            arena_roots[root] = program.buffers[root].nbytes
    offsets, lower_bound = _pack(program, arena_roots)
    arena_bytes = max((offsets[r] + _aligned(n) for r, n in arena_roots.items()), default=0)
    for name in program.buffers:
        root = program.root(name)
        if root not in owner:
            places[name] = Placement(len(external), offsets[root] + program.offset(name))
    return Layout(slots, places, arena_bytes, lower_bound)


def arena_plan(program: Program, sizes: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """The byte offset of each arena tensor (root -> bytes) and the arena's size."""
    offsets, _ = _pack(program, dict(sizes))
    total = max((offsets[r] + _aligned(n) for r, n in sizes.items()), default=0)
    return offsets, total


def lifetimes(program: Program, roots) -> tuple[dict[str, int], dict[str, int]]:
    """The first and last kernel (by step) that touches each of ``roots``; -1 and -1 for
    one never touched, which then has a time of its own."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step, kernel in enumerate(program.kernels):
        for name in kernel.buffers():
            root = program.root(name)
            if root in roots:
                first.setdefault(root, step)
                last[root] = step
    for root in roots:
        first.setdefault(root, -1)
        last.setdefault(root, -1)
    return first, last


def _pack(program: Program, sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    first, last = lifetimes(program, sizes)
    live_peak = 0
    for step in range(len(program.kernels)):
        live_peak = max(
            live_peak, sum(_aligned(sizes[r]) for r in sizes if first[r] <= step <= last[r])
        )
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets: dict[str, int] = {}
    for root in sorted(sizes, key=lambda r: (-sizes[r], first[r])):
        size = _aligned(sizes[root])
        clashes = sorted(
            (lo, hi) for lo, hi, a, z in placed if not (z < first[root] or last[root] < a)
        )
        offset = _best_fit(clashes, size)
        offsets[root] = offset
        placed.append((offset, offset + size, first[root], last[root]))
    return offsets, live_peak


def _best_fit(taken: list[tuple[int, int]], size: int) -> int:
    """The start of the smallest gap of at least ``size`` bytes between taken ranges."""
    best, best_gap, cursor = None, None, 0
    for lo, hi in taken:
        gap = lo - cursor
        if gap >= size and (best_gap is None or gap < best_gap):
            best, best_gap = cursor, gap
        cursor = max(cursor, hi)
    return cursor if best is None else best


def _aligned(n: int) -> int:
    return max((n + ALIGN - 1) // ALIGN * ALIGN, ALIGN)
