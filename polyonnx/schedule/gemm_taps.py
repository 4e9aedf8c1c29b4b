"""A Conv's input read in place by the micro-kernel, a window of taps at a time
(:class:`Taps`: a direct convolution, no im2col), and B read in place row by row
(:func:`b_row_stride`): which GEMMs qualify, and the offsets, masks and lines they read."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from polyonnx.schedule.gemm import Geometry, column_step


def b_row_stride(geo: Geometry) -> int | None:
    """ldb when B's element (k, n) is at ``k * ldb + n`` (plus the outer dims' offset),
    else None."""
    if geo.constraints or column_step(geo.b.coeffs, geo) != 1:
        return None
    ldb = geo.b.coeffs[geo.depth[-1]]
    stride = ldb
    for d in reversed(geo.depth):
        if geo.b.coeffs[d] != stride:
            return None
        stride *= geo.sizes[d]
    return ldb


MAX_TAPS = 49
"""Most taps per channel read in place (a 7x7 window). Up to emit/taps.py's
ROLLED_TAPS taps (with AVX2 all) are unrolled in the K loop, each with its own masks;
more run as a loop over tables of their offsets and masks. Read in place beat packing the
window up to 7x7, on a Zen 5 and a Zen 3: packing an im2col row by row costs most of the
time on small planes (docs/measurements.md, 'Conv windows read in place')."""
SLOTS = 2
"""Most tap slots per live tap (a 3x3 stride-2 window over phases: 16 slots, 9 live; a
7x7 one: 64 slots, 49 live)."""


@dataclass(frozen=True)
class Taps:
    """B read in place from a padded, stride-1 Conv's input (a direct convolution, no
    im2col): B's element (k, n) is at ``(k // count) * step + offsets[k % count] + n``,
    where the window's taps (the trailing K dims, the ones the padding constraints name)
    are ``count`` per channel, and the output rows are as long as the input rows, so
    columns are contiguous. Element (k, n) exists where, for each constraint ``i``,
    ``sum(columns[i][d] * n_d) + bounds[i][k % count] >= 0`` (n_d: the J dims of n)."""

    count: int
    step: int
    offsets: tuple[int, ...]
    columns: tuple[tuple[int, ...], ...]
    """Per constraint, its coefficient of each J dim (in ``geo.cols`` order)."""
    bounds: tuple[tuple[int, ...], ...]
    """Per constraint, per tap: its constant plus its terms in the tap dims."""
    live: tuple[int, ...]
    """The taps some point of the domain has. A Conv over its input's stride phases
    (krnl/ops/phases.py) has a slot per phase and offset, and the slots past its window
    (a constraint on the tap dims alone fails) are skipped: A holds zeros there."""


def b_taps(geo: Geometry) -> Taps | None:
    """B as :class:`Taps` when it can be read in place that way, else None."""
    if not geo.constraints or column_step(geo.b.coeffs, geo) != 1:
        return None
    named = {d for coeffs, _ in geo.constraints for d in geo.depth if coeffs[d]}
    first = next((i for i, d in enumerate(geo.depth) if d in named), len(geo.depth))
    channels, window = geo.depth[:first], geo.depth[first:]
    count = math.prod(geo.sizes[d] for d in window)
    if not window or count > SLOTS * MAX_TAPS:
        return None
    step = geo.b.coeffs[channels[-1]] if channels else 0
    stride = step
    for d in reversed(channels):
        if geo.b.coeffs[d] != stride:
            return None
        stride *= geo.sizes[d]
    taps = [()]
    for d in window:
        taps = [(*t, v) for t in taps for v in range(geo.sizes[d])]
    offsets = tuple(sum(geo.b.coeffs[d] * v for d, v in zip(window, t, strict=True)) for t in taps)
    columns = tuple(tuple(coeffs[d] for d in geo.cols) for coeffs, _ in geo.constraints)
    bounds = tuple(
        tuple(const + sum(coeffs[d] * v for d, v in zip(window, t, strict=True)) for t in taps)
        for coeffs, const in geo.constraints
    )
    dead = [b for c, b in zip(columns, bounds, strict=True) if not any(c)]
    live = tuple(t for t in range(count) if all(b[t] >= 0 for b in dead))
    if len(live) > MAX_TAPS:
        return None
    return Taps(count, step, offsets, columns, bounds, live)


def tap_span(geo: Geometry, taps: Taps) -> tuple[int, int]:
    """The lowest and highest offset, from a channel's B row, of an element some column
    reads in the domain (taps inside the image): every address between the two lies in
    the input, so a load there is safe whatever the lanes' values are used for."""
    sizes = [geo.sizes[d] for d in geo.cols]
    columns = np.arange(math.prod(sizes))
    coords, rest = [], columns
    for size in reversed(sizes):
        coords.insert(0, rest % size)
        rest = rest // size
    low, high = None, None
    for t in taps.live:
        inside = np.ones(columns.shape, dtype=bool)
        for coeffs, bounds in zip(taps.columns, taps.bounds, strict=True):
            inside &= sum(c * x for c, x in zip(coeffs, coords, strict=True)) + bounds[t] >= 0
        if inside.any():
            read = columns[inside] + taps.offsets[t]
            low = int(read.min()) if low is None else min(low, int(read.min()))
            high = int(read.max()) if high is None else max(high, int(read.max()))
    return (0, -1) if low is None else (low, high)


def tap_lines(taps: Taps, nr: int) -> list[tuple[int, int]]:
    """The ranges of offsets (first, last), from a channel's B row at a tile's first
    column, that an NR-wide tile reads through its live taps: taps whose rows overlap or
    nearly so (one window row's) make one range."""
    offsets = sorted(taps.offsets[t] for t in taps.live)
    spans = [[offsets[0], offsets[0]]]
    for offset in offsets[1:]:
        if offset - spans[-1][1] > nr:
            spans.append([offset, offset])
        else:
            spans[-1][1] = offset
    return [(first, last + nr - 1) for first, last in spans]


PREFETCH_CHANNELS = 2
"""How many channels ahead a Conv read in place prefetches the lines of B its tile reads
(``prefetch``); measured with AVX2_PREFETCHED_TAPS_KC, in gemm_defaults.py."""
