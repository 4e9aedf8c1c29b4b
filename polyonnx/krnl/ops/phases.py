"""A strided Conv over the stride phases of its input: the GEMM micro-kernel then reads the
input in place, a window of taps at a time (schedule/gemm_taps.py's ``Taps``), instead of
packing an im2col block of it.

Along an axis of stride s, tap k of output o reads input position s*o + k - p, which is
phase a = (k - p) mod s of the input at position o + (k - p) div s of that phase. A copy
P holds every phase's plane, its rows as long as the output's, and the Conv reads P at
stride 1 (e: the tap's offset, counted from the least one, dmin)::

    S0: P[n, c, a.., i..] = X[n, c, s*i + a ..]               where that is inside X
    S1: Y[n, m, o..] = B[m]                                    (conv.py's init)
    S2: Y[n, g*Mg + m, o..] += P[n, g*Cg + c, a.., o + e + dmin ..] * V[g*Mg + m, c, a.., e..]
        over 0 <= s*(o + e + dmin) + a < size and 0 <= s*(e + dmin) + a + p < kernel

(a, e) is a slot per phase and offset. A slot that is no tap (a 3x3 stride-2 window has 16
slots and 9 taps) is not in the domain: the micro-kernel skips it, and V, the weights laid
out along the slots, holds 0 there, so a packed panel's FMAs over it add nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Statement
from polyonnx.krnl.lower import LowerContext
from polyonnx.krnl.ops.conv import Axis, affine, domain

MAX_TAPS = 49
"""Taps per channel up to which a strided Conv runs over phases (a 7x7 stem): the
micro-kernel reads a window of at most this many in place (schedule/gemm_taps.py's MAX_TAPS);
past it the GEMM packs B anyway, and packing reads the strided input directly."""
MAX_SLOTS = 2
"""Slots a tap at most (3x3 stride 2: 16 for 9; 3x3 stride 3 would take 36), as
schedule/gemm_taps.py's SLOTS: past it the micro-kernel does not read the copy in place, and
packed, every slot is a multiply-add."""

MIN_PLANE = 144
"""Output positions a channel from which a strided Conv runs over phases. V is 16/9 the
size of W (3x3 stride 2), and the fewer the columns, the more the GEMM's time goes to
reading A; 100 positions measured slower (docs/measurements.md, 'Output positions from
which a strided Conv runs over phases')."""

MIN_WINDOW_DEPTH = 144
"""Input channels x taps a group from which a strided Conv runs over phases: with less,
the copy is a pass over the input for a short K loop. Measured on ShuffleNet's stem (27)
and ResNet-50's 7x7 stem (147) (docs/measurements.md, 'Window depth from which a
strided Conv runs over phases')."""


@dataclass(frozen=True)
class Phases:
    """One spatial axis over its phases: ``axis.stride`` phases of ``length`` positions
    (the output's row length along the last axis), and the ``offsets`` taps reach, from
    ``least`` (dmin)."""

    axis: Axis
    length: int
    least: int
    offsets: int

    def slot_tap(self, a: int, e: int) -> int | None:
        """The tap of slot (phase a, offset e), or None when the slot is no tap."""
        k = self.axis.stride * (e + self.least) + a + self.axis.pad
        return k if 0 <= k < self.axis.kernel else None


def plan(axes: Sequence[Axis], x: Buffer, weights: np.ndarray | None) -> tuple[Phases, ...] | None:
    """The phases of a float32 Conv with constant float32 weights, a stride above 1, no
    dilation and at most MAX_TAPS taps, or None when it does not run over phases. Every
    phase must be read (the window at least as wide as the stride) and the last axis's
    rows as long as the output's must hold every input value a tap reads."""
    if x.dtype != "float32" or weights is None or weights.dtype != np.float32:
        return None
    if all(a.stride == 1 for a in axes) or any(a.dilation != 1 for a in axes):
        return None
    if math.prod(a.kernel for a in axes) > MAX_TAPS or any(a.kernel < a.stride for a in axes):
        return None
    depth = weights.shape[1] * math.prod(a.kernel for a in axes)
    if math.prod(a.out for a in axes) < MIN_PLANE or depth < MIN_WINDOW_DEPTH:
        return None
    found = []
    for r, a in enumerate(axes):
        least = -a.pad // a.stride
        offsets = (a.kernel - 1 - a.pad) // a.stride - least + 1
        length = a.out if r == len(axes) - 1 else -(-a.size // a.stride)
        last = min(a.size - 1, a.stride * (a.out - 1) + a.kernel - 1 - a.pad)
        if last // a.stride >= length:
            return None  # the last axis's rows would be longer than the output's
        found.append(Phases(a, length, least, offsets))
    slots = math.prod(p.axis.stride * p.offsets for p in found)
    if slots > MAX_SLOTS * math.prod(a.kernel for a in axes):
        return None
    return tuple(found)


ROW_ALIAS = 2048
"""V's rows get one more channel (of zeros, never read) when their length is a multiple
of this many bytes: the micro-kernel broadcasts A from 16 rows at once, and rows a large
power of two apart fall in one L1 set (docs/measurements.md, 'A channel of zeros against
L1 set aliasing')."""


def slot_weights(weights: np.ndarray, phases: Sequence[Phases]) -> np.ndarray:
    """V[m, c, a.., e..]: W[m, c, k..] at the slot of each tap, 0 at a slot that is none
    (and along a channel past W's, see ROW_ALIAS)."""
    slots = (*(p.axis.stride for p in phases), *(p.offsets for p in phases))
    row = weights.shape[1] * math.prod(slots) * weights.itemsize
    out = np.zeros(
        (weights.shape[0], weights.shape[1] + (row % ROW_ALIAS == 0), *slots), np.float32
    )
    shape = (*weights.shape[:2], *slots)
    rank = len(phases)
    for slot in np.ndindex(*shape[2:]):
        taps = [p.slot_tap(slot[r], slot[rank + r]) for r, p in enumerate(phases)]
        if None not in taps:
            out[(slice(None), slice(shape[1]), *slot)] = weights[(slice(None), slice(None), *taps)]
    return out


def statements(
    ctx: LowerContext,
    x: Buffer,
    weights: np.ndarray,
    phases: Sequence[Phases],
    acc: Buffer,
    head: Sequence[tuple[str, int]],
    channel: tuple[str, str],
) -> tuple[Statement, Statement]:
    """S0 (the phase copy) and S2 (the contraction) of the module docstring. ``head``: the
    output-channel dims and extents ([g,] m), ``channel``: the output and input channel
    as indices (conv.py's Channels.m and Channels.c)."""
    rank = len(phases)
    n, c = x.shape[:2]
    copy_src = ctx.temp(
        f"{acc.name}.phases",
        (n, c, *(p.axis.stride for p in phases), *(p.length for p in phases)),
        x.dtype,
    )
    a_dims, i_dims = kb.dims("a", rank), kb.dims("i", rank)
    dims = ["pn", "pc", *a_dims, *i_dims]
    reads = [
        affine([(p.axis.stride, i), (1, a)]) for p, a, i in zip(phases, a_dims, i_dims, strict=True)
    ]
    inside = [f"{r} < {p.axis.size}" for r, p in zip(reads, phases, strict=True)]
    copy = Statement(
        "S0",
        domain("S0", dims, copy_src.shape, inside),
        kb.access(copy_src.name, "S0", dims, dims),
        kb.load(kb.access(x.name, "S0", dims, ["pn", "pc", *reads]), x.dtype),
    )
    v = ctx.table(f"{acc.name}.slots", slot_weights(weights, phases))
    o_dims, e_dims = kb.dims("o", rank), kb.dims("e", rank)
    names = ["n", *(d for d, _ in head), *o_dims, "c", *a_dims, *e_dims]
    sizes = [
        n,
        *(size for _, size in head),
        *(p.axis.out for p in phases),
        weights.shape[1],
        *(p.axis.stride for p in phases),
        *(p.offsets for p in phases),
    ]
    where = []
    at = []
    for p, o, a, e in zip(phases, o_dims, a_dims, e_dims, strict=True):
        at.append(affine([(1, o), (1, e)], p.least))
        reach = affine([(p.axis.stride, o), (p.axis.stride, e), (1, a)], p.axis.stride * p.least)
        tap = affine([(p.axis.stride, e), (1, a)], p.axis.stride * p.least + p.axis.pad)
        where += [f"0 <= {reach} < {p.axis.size}", f"0 <= {tap} < {p.axis.kernel}"]
    m, ci = channel
    product = kb.binary(
        "mul",
        kb.load(kb.access(copy_src.name, "S2", names, ["n", ci, *a_dims, *at]), x.dtype),
        kb.load(kb.access(v.name, "S2", names, [m, "c", *a_dims, *e_dims]), v.dtype),
    )
    update = Statement(
        "S2",
        domain("S2", names, sizes, where),
        kb.access(acc.name, "S2", names, ["n", m, *o_dims]),
        product,
        "add",
    )
    return copy, update
