"""The GEMM view of a contraction, and the ``ukernel`` schedule that runs it as packed,
cache-tiled, register-blocked GEMM (emitted by emit/ukernel.py).

A contraction ``C[..] += A[..] * B[..]`` (MatMul, Gemm, batched products, Conv as implicit
GEMM) is read as, for every value of its *outer* dims,

    C[m, n] += sum_k A[m, k] * B[k, n]      m: one dim (rows), n: the J dims, k: the K dims

- K: the dims C does not depend on (reduced), flattened in statement order; A must be
  contiguous along them (row-major weights, a MatMul's left operand), so the micro-kernel
  broadcasts A straight from memory;
- J: the innermost dims of C, contiguous there, that A does not depend on (a MatMul's j,
  a Conv's output rows and columns), flattened into columns n;
- the row dim m: a dim of C that B does not depend on (a MatMul's i, a Conv's output
  channel); every other dim is outer and stays an isl loop (batch, groups).

B may be any affine function of (k, n), and the domain may cut the (k, n) box with affine
constraints (a padded Conv: the taps that fall outside the image): packing B copies a
(KC x NC) block into a contiguous panel, writing zero where the domain has no point. This
is implicit GEMM; the packed panel is im2col for one block only. Where the Conv is
stride-1 and keeps its rows' length, B can instead be read in place, a window of taps at a
time under masks (``Taps``, packb=0): no im2col at all.

Schedule: the statement's loops become ``outer.. / m / n.. / k..`` with a ``ukernel`` mark
above ``m``; the mark carries the parameters (MR, NR, KC, MC, NC, K-unroll, and how the
GEMM is split over threads). The reduction keeps its order: each C element is loaded into
its accumulator, gets its products added in the original k order, and is stored back.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

import islpy as isl
import numpy as np

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import (
    Binary,
    Buffer,
    Cast,
    Const,
    Kernel,
    Load,
    Select,
    Statement,
    Unary,
    children,
    loads,
)
from polyonnx.krnl.islutil import (
    dim_names,
    extents,
    is_whole_identity,
    parse_access,
    parse_set,
    row_major_strides,
)
from polyonnx.schedule import annotate
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.nest import loop_name, loop_nest
from polyonnx.schedule.state import UKERNEL, Nest, State, Var
from polyonnx.schedule.tree import KernelSchedule

MIN_ROWS = 4
MIN_COLUMNS = 16
MIN_DEPTH = 8


@dataclass(frozen=True)
class Affine:
    """A flat element offset into a buffer: ``const + sum(coeffs[d] * dim d)``."""

    buffer: str
    coeffs: tuple[int, ...]
    const: int


@dataclass(frozen=True)
class Geometry:
    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    row: int
    cols: tuple[int, ...]
    """J dims, outermost first (the last is contiguous in C)."""
    depth: tuple[int, ...]
    """K dims, in statement order (A is contiguous along their flattening)."""
    outer: tuple[int, ...]
    a: Affine
    b: Affine
    c: Affine
    constraints: tuple[tuple[tuple[int, ...], int], ...]
    """``sum(coeffs[d] * d) + const >= 0`` cutting the (k, n) box (a padded Conv)."""

    @property
    def m(self) -> int:
        return self.sizes[self.row]

    @property
    def n(self) -> int:
        return math.prod(self.sizes[d] for d in self.cols)

    @property
    def k(self) -> int:
        return math.prod(self.sizes[d] for d in self.depth)

    @property
    def lda(self) -> int:
        return self.a.coeffs[self.row]

    @property
    def ldc(self) -> int:
        return self.c.coeffs[self.row]


@dataclass(frozen=True)
class Params:
    """Register tile MR x NR (NR a multiple of the SIMD width), cache blocks KC/MC/NC,
    K-loop unroll, and the thread split: "rows", "cols" or "none"."""

    mr: int = 8
    nr: int = 32
    kc: int = 256
    mc: int = 128
    nc: int = 512
    unroll: int = 4
    split: str = "none"
    packa: int = 0
    """1: copy each MC x KC block of A into MR-interleaved panels (contiguous broadcasts,
    no cache-set conflicts between rows a large power of two apart)."""
    packb: int = 1
    """0: read B in place, row by row, instead of packing it (no padding, B contiguous
    along the columns and evenly strided along k): for few rows, packing costs more
    than it saves."""
    prefetch: int = 0
    """1: while a row panel computes its first column tile, prefetch the next panel's A
    (read in place, not packed) into L2, so that the next panel does not wait on memory.
    A Conv whose input is read in place (taps) prefetches instead the lines of B that the
    tile reads PREFETCH_CHANNELS channels on."""

    def mark(self) -> str:
        """The isl mark name, e.g. ``ukernel_mr8_nr32_kc256_mc128_nc512_unroll4_splitcols``
        (isl ids survive printing and parsing only as plain words)."""
        return "_".join([UKERNEL, *(f"{k}{v}" for k, v in asdict(self).items())])

    @staticmethod
    def from_mark(name: str) -> Params:
        values = {}
        for word in name.split("_")[1:]:
            key = next(f.name for f in fields(Params) if word.startswith(f.name))
            text = word[len(key) :]
            values[key] = text if key == "split" else int(text)
        return Params(**values)


def is_ukernel_mark(name: str) -> bool:
    return name.startswith(UKERNEL + "_")


def geometry(stmt: Statement, buffers: Mapping[str, Buffer]) -> Geometry | None:
    """The GEMM view of ``stmt`` (module docstring), or None when it is not one."""
    if stmt.reduce != "add" or not isinstance(stmt.expr, Binary) or stmt.expr.op != "mul":
        return None
    loads = [stmt.expr.a, stmt.expr.b]
    if not all(isinstance(x, Load) and x.dtype == "float32" for x in loads):
        return None
    if buffers[stmt.write.buffer].dtype != "float32":
        return None
    domain = parse_set(stmt.domain)
    names = tuple(dim_names(stmt))
    sizes = tuple(extents(stmt))
    if (
        not names
        or domain.is_empty()
        or any(int(domain.dim_min_val(d).to_python()) != 0 for d in range(len(names)))
    ):
        return None
    c = _affine(stmt.write.buffer, stmt.write.index, buffers)
    ops = [_affine(x.access.buffer, x.access.index, buffers) for x in loads]
    if c is None or None in ops:
        return None
    depth = tuple(d for d in range(len(names)) if c.coeffs[d] == 0 and sizes[d] > 1)
    if not depth:
        return None
    if math.prod(n for d, n in enumerate(sizes) if d not in depth) != buffers[c.buffer].size:
        return None  # C elements no product reaches (a Conv's last row in its padding)
    inner = [d for d in range(len(names)) if c.coeffs[d] == 1 and sizes[d] > 1]
    if len(inner) != 1:
        return None
    moving = [x for x in ops if x.coeffs[inner[0]] != 0]
    if len(moving) != 1:
        return None
    b = moving[0]
    a = ops[1] if b is ops[0] else ops[0]
    cols = _columns(inner[0], a, c, sizes)
    rows = [
        d for d in range(len(names))
        if d not in cols and d not in depth and sizes[d] > 1
        and b.coeffs[d] == 0 and a.coeffs[d] != 0 and c.coeffs[d] != 0
    ]  # fmt: skip
    if not rows or not _contiguous(a, depth, sizes):
        return None
    row = max(rows, key=lambda d: sizes[d])
    unit = [d for d in range(len(names)) if sizes[d] == 1]
    outer = tuple(d for d in range(len(names)) if d != row and d not in cols and d not in depth)
    constraints = _constraints(domain, len(names), set(cols) | set(depth), set(unit))
    if constraints is None:
        return None
    return Geometry(names, sizes, row, cols, depth, outer, a, b, c, constraints)


def vector_registers(lanes: int) -> int:
    """Architectural vector registers of a float32 SIMD width: AVX-512 has 32, AVX2 and
    SSE 16."""
    return 32 if lanes >= 16 else 16


def worth_it(geo: Geometry, lanes: int) -> bool:
    """Big enough in every direction for packing and a register tile to pay off."""
    return geo.m >= MIN_ROWS and geo.n >= max(MIN_COLUMNS, lanes) and geo.k >= MIN_DEPTH


def default_params(geo: Geometry, lanes: int, registers: int) -> Params:
    """Register tile from the vector registers (MR x NR/lanes accumulators, NR/lanes B
    vectors and a broadcast A value must fit), K blocks whose B micro-panel stays in L1,
    and the thread split that needs no duplicated packing."""
    mr = min(8 if registers >= 32 else 6, geo.m)  # a short GEMM: all its rows in one tile
    if mr == 8 and _round_up(geo.m, 8) >= ROW_WASTE * _round_up(geo.m, 6):
        mr = 6  # 34 rows: 6 tiles of 6 (36 rows computed), not 5 of 8 (40)
    if registers < 32 and mr == 6 and _round_up(geo.m, 6) >= AVX2_ROW_WASTE * _round_up(geo.m, 4):
        mr = 4  # 8 rows: 2 tiles of 4, not 2 of 6 (12 rows computed)
    nr = 2 * lanes
    kc = _even(geo.k, KC if registers < 32 else AVX512_KC, 32)
    taps = b_taps(geo)
    if taps is not None:  # a padded 3x3 to 7x7 Conv: its input in place, no im2col
        packb, kc = 0, _even(geo.k, TAPS_KC, taps.count)  # the tile: see TAPS_KC
    nc = _even(geo.n, NC, nr)
    if taps is None:
        b_bytes = 4 * geo.k * geo.n
        streamed = geo.m <= STREAM_ROWS and STREAM_BYTES < b_bytes < MEMORY_BYTES
        short = geo.m < SHORT_ROWS and geo.k <= SHORT_DEPTH and b_bytes < MEMORY_BYTES
        packb = int(
            (geo.m >= PACK_ROWS and not streamed and not short) or b_row_stride(geo) is None
        )
        if not packb and geo.m < PACK_ROWS and b_bytes >= MEMORY_BYTES:
            kc, nc = ROWS_KC, _even(geo.n, ROWS_NC, nr)  # B read a few whole rows at a time
    work = geo.m * geo.n * geo.k
    batches = math.prod(geo.sizes[d] for d in geo.outer)
    split = "none"
    if work >= (BATCHED_SPLIT_WORK if batches > 1 else PARALLEL_WORK):
        split = "cols" if geo.n >= 4 * nr else "rows"
        if taps is not None and 4 * geo.m * geo.k >= TAPS_ROWS_BYTES and geo.m >= 2 * mr:
            split = "rows"
    prefetch = int(taps is None and 4 * geo.m * geo.k >= PREFETCH_A_BYTES)
    mc, packa, unroll = 64, 0, 4
    if registers < 32:  # AVX2: see AVX2_MC
        mc, unroll = AVX2_MC, AVX2_UNROLL if packb else 4
        packa = int(
            taps is None
            and packb
            and 4 * geo.m * geo.k >= AVX2_PACK_A_BYTES
            and geo.n >= AVX2_PACK_A_COLUMNS
        )
        a_bytes = 4 * geo.m * geo.k * math.prod(geo.sizes[d] for d in geo.outer if geo.a.coeffs[d])
        prefetch = int(taps is None and not packa and a_bytes >= AVX2_PREFETCH_A_BYTES)
        if packb and mr == 6 and geo.k < AVX2_SHALLOW_K:
            mr = 4  # see AVX2_SHALLOW_K
        if packb and geo.k <= AVX2_PANEL_K:
            mc = mr  # see AVX2_PANEL_K
        if taps is not None:  # B's lines prefetched: see AVX2_PREFETCHED_TAPS_KC
            prefetch, kc = 1, _even(geo.k, AVX2_PREFETCHED_TAPS_KC, taps.count)
        if packa:
            nc = _even(geo.n, AVX2_PACKED_A_NC, nr)
    elif packb and scratch_bytes(Params(kc=kc, nc=nc, nr=nr, packb=1)) > SCRATCH_BYTES:
        nc = _even(geo.n, (SCRATCH_BYTES // (4 * kc) - nr) // nr * nr, nr)  # see AVX512_KC
    return Params(
        mr=mr,
        nr=nr,
        kc=kc,
        mc=mc,
        nc=nc,
        unroll=unroll,
        split=split,
        packa=packa,
        packb=packb,
        prefetch=prefetch,
    )


AVX2_MC = 72
AVX2_PACK_A_BYTES = 2 << 20
AVX2_PACKED_A_NC = 1024
AVX2_UNROLL = 8
AVX2_ROW_WASTE = 1.1
"""With AVX2's 16 registers (a 6 x 16 tile), measured on a Zen 3 (32 KB L1, 512 KB L2),
1 thread, each variant against numpy's OpenBLAS in alternating rounds, the median of the
per-round time ratios (polyonnx / numpy), the AVX-512 defaults -> these:

- MC = 72 rows, twelve whole 6-row tiles (64 left a 4-row tile computed as 6 in every
  block), and no prefetch of A as it was then (the line index divided by MR in the K loop;
  see AVX2_PREFETCH_A_BYTES for the prefetch now): that address arithmetic costs a 6 x 16
  tile a fifth of its time. MatMul 512^3 1.04 -> 0.97 (prefetch alone: 1.04 -> 0.97),
  256 x 1024 x 196 (a ResNet 1x1 Conv's shape) 1.28 -> 1.00, 512 x 2048 x 49 1.06 ->
  0.83, 1024^3 1.17 -> 1.08.
- A of AVX2_PACK_A_BYTES or more packed into MR-interleaved panels, with column blocks of
  up to AVX2_PACKED_A_NC (fewer passes of packing A): 1024^3 1.08 -> 0.99-1.00, 2048^3
  1.10 -> 1.04, 1000^3 1.05 -> 0.98; but 512^3 (A 1 MB) 0.91 -> 0.94, and K blocks of 256
  were slower (1024^3 1.03, 2048^3 1.15).
- The K loop unrolled 8 times, not 4 (a 6 x 16 step is half an 8 x 32 one): with the
  above, 1024^3 1.02-1.06 -> 0.95-1.00, 1000^3 1.00 -> 0.97, 512^3 1.02 -> 0.99,
  256 x 1024 x 196 1.01 -> 1.00, 2048^3 1.04 either way; with B read in place it was
  slower, so that keeps 4: 64 x 256 x 3136 1.16 (4) against 1.29 (8), 8 x 784 x 512
  (4-row tiles) 0.94 against 1.14.
- 4-row tiles where 6-row ones would compute AVX2_ROW_WASTE times the rows (8 rows: 12
  computed): 8 x 784 x 512 (an MLP layer at batch 8) 1.16 -> 0.94. Measured on Zen 3
  against onnxruntime, 6 -> 4 rows: 32 rows (36 computed) 3x3 Conv 128->32 at 56x56 (a
  DenseNet layer) 1.09 -> 1.04, 1x1 256->32 at 27x27 1.06 -> 0.95; 16 rows (18) 1x1
  64->16 at 55x55 0.80 -> 0.69; but 28 rows (30) 3x3 128->28 at 28x28 0.93 -> 0.95."""


AVX2_PREFETCH_A_BYTES = 1 << 17
"""From this size (a quarter of a Zen 3's 512 KB L2) an A read in place is prefetched on
AVX2 (``prefetch``; the prefetches take one address each, the base plus the K index and a
constant). Measured in light ResNet-50, 1 thread, one process, each kernel's median over
30 alternating rounds, none -> from 1 MB: 1x1 Conv 512 -> 2048 at 7x7 (A 4 MB, x3) 1.78-1.87
-> 1.60-1.65 ms, 1024 -> 256 at 14x14 (1 MB) 1.93 -> 1.77, the model's kernels 142.0 ->
140.2 ms; 1 MB -> 128 KB: 256 -> 512 stride 2 (512 KB) 3.08 -> 2.88, 512 -> 128 at 28x28
(256 KB) 1.45 -> 1.31, kernels 112.0 -> 110.3 ms; all sizes: 64 -> 256 at 56x56 (64 KB,
x4) 1.40-1.67 -> 1.56-1.82, hence the threshold. MatMuls whose A stays in cache from one
call to the next measured alike with and without (256^3 to 768^3, 1024 x 256 x 196).

A that differs along the batch dims counts whole: a Winograd Conv's 16 GEMMs (krnl/ops/
winograd.py) read 16 different weight blocks, each once an inference. 128 -> 128 at 28x28
(16 blocks of 64 KB), per-kernel medians over 20 alternating rounds: 2.06 -> 1.96 and
2.03 -> 1.87 ms; the model's kernels 126.2 -> 124.5 ms."""


AVX2_PANEL_K = 64
"""On AVX2, a GEMM with B packed and at most this deep takes row blocks of one tile (MC =
MR): a row panel then sweeps every column tile of the block, and its C rows and epilogue
operands (a residual Add's) are MR streams the hardware prefetchers follow, where a
72-row block down one column tile touches a line of 72 rows, whose latency a K loop this
short does not hide. Measured 1 thread: light ResNet-50's 1x1 Convs 64 -> 256 at 56x56
with a residual Add, per-kernel medians over 20 alternating rounds, 1.89-1.98 ->
1.77 ms (x3), the one without 1.57 -> 1.59 (MC = 8: 1.77 -> 1.93); MatMul 4096 x 64 x 4096
0.66 -> 0.58 times numpy's time; models to onnxruntime, one process: SqueezeNet 1.163 ->
1.138, ShuffleNet 0.916 -> 0.899, AlexNet 0.820 -> 0.797, ZFNet 0.710 -> 0.688, others
alike. At 128 deep (512 -> 128 at 28x28) it measured slower."""

AVX2_PACK_A_COLUMNS = 128
"""Fewer columns than this and A is not packed on AVX2 whatever its size: packing copies
all of A for few FMAs per element. Measured like AVX2_SHALLOW_K, packed -> in place:
MatMul 2048 x 1024 x 49 (ResNet-50's 1x1 stride-2 Conv 1024 -> 2048) 0.99 -> 0.78,
1024 x 1024 x 64 0.94 -> 0.86, x 128 0.87 either way, x 196 0.94 -> 1.00 (packed stays);
3x3 stride-2 Conv 512 -> 512 at 14x14 1.45 -> 1.12 times onnxruntime's time."""

AVX2_SHALLOW_K = 256
"""Below this depth, a GEMM whose B is packed takes 4-row tiles on AVX2, not 6-row ones.
Measured on the Zen 3 like the above (ratios to numpy; Convs to onnxruntime, one process),
6 -> 4 rows: MatMul 256 x 64 x 3136 1.23 -> 0.97, 256 x 128 x 3136 1.14 -> 1.03, but
256 x 256 x 3136 1.13 -> 1.10 and 256 x 512 x 3136 1.04 -> 1.07; 1x1 Conv 64 -> 256 at
56x56 1.18 -> 0.84; a first layer's Conv 3 -> 64, 3x3 stride 2 at 224x224 (K = 27)
1.70 -> 1.10 and 7x7 stride 2 (K = 147) 1.25 -> 1.07. B read in place keeps 6 rows (1x1
Conv 64 -> 64 at 56x56 1.01 against 1.04)."""


PREFETCH_A_BYTES = 1 << 20
"""From this size (the L2 of the Zen 4 this was measured on) A is prefetched a row panel
ahead by default: it cannot stay in L2 from one call to the next, and a model's weights
come from memory, which the hardware prefetchers do not follow across the MR rows of a
panel. Measured in light ResNet-50 at 1 thread, 30 rounds, all kernels of a shape: 1x1
Conv 512->2048 at 7x7 3.65 -> 2.97 ms (x3), 256->1024 at 14x14 7.09 -> 6.55 (x6),
1024->2048 (stride 2) 2.43 -> 2.19, 1024->512 at 14x14 2.18 -> 2.06, the model 1.106 ->
1.063 x onnxruntime's time; but with A of 64 KB, 64->256 at 56x56 5.12 -> 5.45 (x4)."""


ROW_WASTE = 1.05
"""8-row tiles give way to 6-row ones when they compute this many times the rows that
6-row tiles do (the last tile's extra rows are computed and dropped). Measured 1 thread,
1x1 Conv 136 -> 136 at 28x28 in 4 groups (34 rows each), B in place: 103 -> 91 us."""

PACK_ROWS = 32
"""Rows from which packing B pays for itself by default (each packed element is then
read by at least 4 register tiles)."""

SHORT_ROWS = 192
SHORT_DEPTH = 192
"""A GEMM of fewer than SHORT_ROWS rows and at most SHORT_DEPTH deep reads B in place:
packing is a pass that no FMA overlaps, and few row tiles share it. Measured 1 thread,
packed -> in place (1x1 Convs, rows x depth x columns): 34 x 34 x 784 (group 4, x4)
119 -> 103 us, 68 x 68 x 196 (group 4) 98 -> 91, 64 x 64 x 3136 266 -> 249, 80 x 80 x 784
(group 3) 322 -> 300, 128 x 128 x 784 250 -> 241, 160 x 160 x 196 (group 3) 304 -> 295;
but 128 x 256 x 784 496 -> 512. A B of MEMORY_BYTES or more is packed all the same: read
in place, a K x NC strip of it comes from memory a row at a time. MatMul, 1 thread, in
place -> packed: 128 x 128 x 16384 21.7 -> 8.5 ms (numpy 8.2), 32 x 64 x 50176 11.6 ->
5.4 (4.5), 100 x 100 x 20000 7.9 -> 6.4 (5.9), 64 x 147 x 12544 6.5 -> 4.5 (3.6)."""

STREAM_ROWS = 128
STREAM_BYTES = 1 << 20
"""Up to STREAM_ROWS rows, a B of more than STREAM_BYTES (the L2 of the Zen 4 this was
measured on) but less than MEMORY_BYTES is read in place, not packed: it comes from
memory either way, and packing is then a pass bound by memory that no FMA overlaps,
shared by few row tiles. Measured 1
thread in light ResNet-50, packed -> in place: Conv 1x1 256->64 at 56x56 1.02 -> 0.95 ms,
512->128 at 28x28 0.99 -> 0.96, 256->128 at 56x56 2.00 -> 1.95; but 64->256 at 56x56
(256 rows) 0.93 -> 0.96, 1024->256 at 14x14 (B 0.8 MB) 1.02 -> 1.05, and MatMul
256x1024x3136 16.8 -> 18.5 ms, 1024^3 20.7 -> 22.9 ms."""

MEMORY_BYTES = 4 << 20
ROWS_KC = 16
ROWS_NC = 4096
"""A B of MEMORY_BYTES or more comes from memory, and a column strip of KC rows at a
time (each row's 128 bytes in another page) is a pattern the prefetchers do not follow.
With PACK_ROWS rows or more it is packed (its rows copied in NC-wide runs), not streamed
in place; with fewer, it is read in place ROWS_KC whole rows (up to ROWS_NC columns) at a
time, side by side. Measured 1 thread, default -> this: MatMul 8x4096x4096 14.0-16.6 ->
6.1-7.8 ms, 8x2048x2048 4.86 -> 1.58, 16x4096x4096 23.2 -> 15.4, 8x1024x1024
0.252 -> 0.236 (but 8x784x512, B 1.6 MB: 0.087 -> 0.095, hence the threshold);
64x1024x1024 2.07 -> 1.69, 64x1024x2048 6.72 -> 4.72, 128x512x3136 5.83 -> 5.05,
32x2048x2048 4.81 -> 4.26; in place stays better at 64x256x3136 (B 3.2 MB): 1.15 against
1.20 packed."""

TAPS_ROWS_BYTES = 1 << 20
"""A Conv read in place with weights (A) of this size or more (more than the L2 of the
Zen 4 this was measured on) splits its rows over threads, not its columns: each thread
then reads half of A, which in a model comes from memory, and B is read in place, so no
packing is duplicated. Measured in light ResNet-50, 2 threads, 30 rounds, per kernel,
columns -> rows in one process: 3x3 256->256 at 14x14 (A 2.4 MB, x6) 1.28-1.38 ->
1.16-1.26 ms; 3x3 stride 2 over phases (krnl/ops/phases.py) 256 at 28 (4.2 MB) 1.66-1.79
-> 1.55-1.61. 128 at 56 (1.06 MB) took 1.58-1.62 with columns, its packed im2col form
1.41-1.48; in other runs, 1.20-1.29 with rows and the packed form 1.34-1.44."""

TAPS_KC = 2304
"""A padded 3x3 Conv reads its input in place, with the 8 x 2W register tile of any GEMM
(two B vectors and their masks a tap; 8 broadcasts of A) and K blocks of up to TAPS_KC
(B is not packed, so long blocks cost no stack and load C fewer times).

On a Zen 5 (AVX-512 at full width), 1 thread, one process, against onnxruntime, a 16 x W
tile -> 8 x 2W: 3x3 stride-2 Convs over phases (krnl/ops/phases.py) 128->128 at 56x56
1.167 -> 1.003, 256->256 at 28x28 1.186 -> 1.031; light models, alternating rounds:
ResNet-50 0.877 -> 0.870, Inception v2 0.838 -> 0.827, DenseNet-121 0.744 -> 0.739,
SqueezeNet 0.981 -> 0.959, Inception v1 0.503 -> 0.508.

Before, on a Zen 4 (512-bit registers, 256-bit FMA pipes), 1 thread, packed 8x32 -> in
place 16x16: 64->64 at 56x56 2.25 -> 2.08 ms (onnxruntime 2.13), 128->128 at
28x28 2.30 -> 2.05 (2.05), 256->256 at 56x56 35.3 -> 33.2 (33.2), 256->256 at 14x14 2.26
-> 2.18 (2.00), 512->512 at 7x7 2.53 -> 2.45 (2.62), 128->128 at 7x7 173 -> 145 us,
64->256 at 13x13 0.50 -> 0.46, 128->32 at 28x28 0.77 -> 0.53, 16->64 at 55x55 0.55 ->
0.51. In place 8x32 took 2.17 ms at 56x56 and 2.16 at 28x28."""


KC = 512
NC = 512
"""Largest default K and column blocks (measured on MatMul 2048^3, Zen 4)."""

AVX512_KC = 2048
"""Largest default K block with AVX-512's 32 registers: the 8 x 32 tile's B micro-panel
(up to 256 KB) then streams from L2, and C is loaded and stored once where K fits one
block; the column block shrinks so the packed panel fits SCRATCH_BYTES (352 columns at
K = 2048). Measured on a Zen 5 (48 KB L1, 1 MB L2), 1 thread, against numpy in
alternating rounds (time ratios to numpy), KC 512 -> 1024: MatMul 1024^3 0.527 -> 0.502,
2048^3 0.522 -> 0.519, 1000^3 0.533 -> 0.516, 2048 x 1024 x 49 0.509 -> 0.482, 512 x 2048
x 49 0.516 -> 0.502; light ResNet-50 0.878 -> 0.876 times onnxruntime's time. Then, B
packed by the first row tile (emit/ukernel.py), 1024 -> 2048 with 352 columns: 2048^3
0.520 -> 0.505, 1024 x 2048 x 1024 0.520 -> 0.510, 1000 x 1500 x 1000 0.519 -> 0.504,
512 x 2048 x 49 0.512 -> 0.504, 256 x 2048 x 196 0.530 -> 0.524."""


def _even(total: int, largest: int, multiple: int) -> int:
    """The block size that cuts ``total`` into the fewest blocks of at most ``largest``,
    all about the same size (a multiple of ``multiple``): 576 -> 2 x 288, not 512 + 64."""
    blocks = max(-(-total // largest), 1)
    return min(_round_up(-(-total // blocks), multiple), _round_up(total, multiple))


PARALLEL_WORK = 1_000_000
"""Multiply-adds (~10 us of work) from which a contraction is split over threads by
default. One thread runs the whole range as one chunk, so the split costs nothing there;
with the worker pool (emit/pool.py) a few microseconds buy the second core: at 2 threads
light ShuffleNet went 5.5 -> 4.4 ms and SqueezeNet 5.2 -> 4.5 ms against 10M."""

BATCHED_SPLIT_WORK = 10 * PARALLEL_WORK
"""The same for one GEMM of a batch: below it the GEMM is not split, and the batch loop
runs on threads instead (attention's per-head products; see _threads_over_batches)."""


def _columns(inner: int, a: Affine, c: Affine, sizes) -> tuple[int, ...]:
    """The J dims: from the innermost dim of C outwards while C stays contiguous and A does
    not depend on them."""
    cols = [inner]
    stride = sizes[inner]
    while True:
        nxt = [
            d for d in range(len(sizes))
            if d not in cols and c.coeffs[d] == stride and a.coeffs[d] == 0 and sizes[d] > 1
        ]  # fmt: skip
        if len(nxt) != 1:
            return tuple(reversed(cols))
        cols.append(nxt[0])
        stride *= sizes[nxt[0]]


def _contiguous(a: Affine, depth: tuple[int, ...], sizes) -> bool:
    """A's offset is ``k_flat`` (times 1) plus terms of the other dims."""
    stride = 1
    for d in reversed(depth):
        if a.coeffs[d] != stride:
            return False
        stride *= sizes[d]
    return True


def _affine(buffer: str, index: str, buffers: Mapping[str, Buffer]) -> Affine | None:
    maff = parse_access(index)
    if any(not _integral(maff.get_aff(r)) for r in range(maff.dim(isl.dim_type.out))):
        return None
    shape = buffers[buffer].shape
    count = maff.dim(isl.dim_type.in_)
    coeffs = [0] * count
    const = 0
    for r, stride in enumerate(row_major_strides(shape)):
        aff = maff.get_aff(r)
        if aff.dim(isl.dim_type.div):
            return None
        for d in range(count):
            coeffs[d] += int(aff.get_coefficient_val(isl.dim_type.in_, d).to_python()) * stride
        const += int(aff.get_constant_val().to_python()) * stride
    return Affine(buffer, tuple(coeffs), const)


def _constraints(domain: isl.Set, count: int, allowed: set[int], unit: set[int]):
    """The domain's constraints that involve two or more dims (the box is implied by the
    extents), each over J and K dims only; None when the domain is not of that form.
    Dims of extent 1 are 0 throughout, so they drop out."""
    if domain.n_basic_set() != 1:
        return None
    (piece,) = domain.get_basic_sets()
    if piece.dim(isl.dim_type.div):
        return None
    found = []
    for con in piece.get_constraints():
        coeffs = tuple(
            0 if d in unit else int(con.get_coefficient_val(isl.dim_type.set, d).to_python())
            for d in range(count)
        )
        involved = [d for d in range(count) if coeffs[d]]
        if len(involved) < 2:
            continue
        if any(d not in allowed for d in involved):
            return None
        const = int(con.get_constant_val().to_python())
        found.append((coeffs, const))
        if con.is_equality():
            found.append((tuple(-x for x in coeffs), -const))
    return tuple(found)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def ukernel_schedule(
    kernel: Kernel, buffers: Mapping[str, Buffer], params_for
) -> KernelSchedule | None:
    """The kernel with its one contraction run by the micro-kernel (``params_for(geometry)``
    gives the parameters, None: do not), the other statements in their default nests; None
    when the kernel has no such contraction or the order would break a dependence."""
    found = [(s, geometry(s, buffers)) for s in kernel.statements]
    found = [(s, g) for s, g in found if g is not None]
    if len(found) != 1:
        return None
    stmt, geo = found[0]
    params = params_for(geo)
    if params is None:
        return None
    state = with_ukernel(State.original(kernel), stmt.name, geo, params, buffers)
    if state is None:
        return None
    return _threads_over_batches(state, geo, params).to_kernel_schedule()


def _threads_over_batches(state: State, geo: Geometry, params: Params) -> State:
    """A batch of GEMMs, each too small to split, with enough work in all: the outermost
    batch loop runs on threads (attention's per-head products)."""
    batches = [d for d in geo.outer if geo.sizes[d] >= 2]
    total = geo.m * geo.n * geo.k * math.prod(geo.sizes[d] for d in geo.outer)
    if params.split != "none" or not batches or total < PARALLEL_WORK:
        return state
    with contextlib.suppress(ScheduleError):
        state = annotate.parallel(state, dependences(state.kernel), f"{geo.dims[batches[0]]}_g")
    return state


def ukernel_state(
    state: State, buffers: Mapping[str, Buffer], given: Mapping[str, object], lanes: int
) -> State:
    """The schedule primitive: ``state`` with its contraction run by the micro-kernel with
    the ``given`` parameters (the rest from the default); ScheduleError saying why not."""
    found = [(s, geometry(s, buffers)) for s in state.kernel.statements]
    found = [(s, g) for s, g in found if g is not None]
    if len(found) != 1:
        raise ScheduleError(
            f"ukernel: kernel {state.kernel.name!r} needs exactly one float32 contraction "
            f"C[.., m, n] += A[.., m, k] * B[.., k, n] with A contiguous along k; it has "
            f"{len(found)}"
        )
    stmt, geo = found[0]
    if state.nest(stmt.name).names() != dim_names(stmt) or state.marks:
        raise ScheduleError(
            f"ukernel: {stmt.name}'s loops were already transformed; ukernel replaces them, "
            f"so apply it first"
        )
    unknown = set(given) - {f.name for f in fields(Params)}
    if unknown:
        raise ScheduleError(f"ukernel: unknown parameters {sorted(unknown)}")
    params = replace(default_params(geo, lanes, vector_registers(lanes)), **given)
    _check(params, lanes, geo)
    result = with_ukernel(state, stmt.name, geo, params, buffers)
    if result is None:
        raise ScheduleError(f"ukernel: the GEMM order would break a dependence of {stmt.name}")
    return result


SCRATCH_BYTES = 3 << 20
"""Stack room for a thread's packed B block (worker stacks are 4 MB, emit/threads.py)."""


def scratch_bytes(params: Params) -> int:
    """Stack the GEMM's packed blocks take (emit/ukernel.py allocates them)."""
    b_block = (
        params.kc * (-(-params.nc // params.nr) * params.nr + params.nr) if params.packb else 0
    )
    a_block = -(-params.mc // params.mr) * params.mr * params.kc if params.packa else 0
    return 4 * (b_block + a_block)


def b_row_stride(geo: Geometry) -> int | None:
    """ldb when B's element (k, n) is at ``k * ldb + n`` (plus the outer dims' offset),
    else None."""
    if geo.constraints or _column_step(geo.b.coeffs, geo) != 1:
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
more run as a loop over tables of their offsets and masks. Measured against packing the
window, ratio to onnxruntime's time, 1 thread: on a Zen 5 (8 x 32 tile, taps rolled), 5x5
128->128 at 28x28 1.18 -> 0.94, the 7x7 stride-2 stem over its phases 1.19 -> 0.96; as
AVX2 code on the Zen 5, the stem 2.47 -> 2.02 ms; on a Zen 3 (AVX2, 6 x 16 tile,
unrolled), 5x5 pad 2: 16->32 at 27x27 2.72 -> 1.18, 32->96 at 27x27 1.62 -> 1.21, 24->64
at 13x13 1.78 -> 0.97, 32->64 at 13x13 1.99 -> 1.04, 48->128 at 7x7 1.50 -> 1.06,
128->128 at 28x28 1.52 -> 1.27 (packing an im2col row by row costs most of the time on
planes this small)."""
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
    if not geo.constraints or _column_step(geo.b.coeffs, geo) != 1:
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
AVX2_PREFETCHED_TAPS_KC = 4608
"""On AVX2, a Conv read in place prefetches the lines of B its tile reads PREFETCH_CHANNELS
channels ahead (``prefetch``): L2 serves B at a plane's stride from one channel to the
next, which the hardware prefetchers do not follow, and B does not stay in L1 from one
row tile to the next. Measured 1 thread against onnxruntime, one process, none -> 1 -> 2
channels ahead, 3x3 Convs: 512->512 at 28x28 1.20 -> 1.14 -> 1.15, at 14x14 1.14 -> 1.07
-> 1.06, 128->128 at 28x28 1.03 -> 0.99 -> 0.97, 256->256 at 56x56 1.07 -> 1.08 -> 1.05.
It was first taken only where a tile reads more than 48 KB of A and B a K block (64->64
at 56x56, 38 KB, measured 1.07 -> 1.14 in one run, 1.03-1.05 -> 0.97 in another); with
every Conv prefetching, per-kernel medians over alternating rounds in light VGG-19: 64->64
at 224x224 73.8 -> 62.9 ms, 64->128 at 112x112 32.9 -> 28.3, 3->64 7.0 -> 6.2; in
ResNet-50: 64->64 at 56x56 3.72 -> 3.54, 512->512 at 7x7 4.03 -> 3.77 (one K block, not
4); models to onnxruntime: ResNet-50 1.144 -> 1.136, Inception v1 0.781 -> 0.747,
Inception v2 1.171 -> 1.149, SqueezeNet 1.146 -> 1.109, DenseNet-121 0.943 -> 0.952.

Such a Conv takes K blocks of up to AVX2_PREFETCHED_TAPS_KC taps (every channel of a 3x3
window up to 512): with B's lines on their way, fewer blocks (C loaded and stored, the
masks worked out, once a block) won over keeping a 72-row block of A in L2 (1152 taps).
Measured 1 thread against onnxruntime, two runs, 1152 -> 2304 taps: 3x3 256->256 at 56x56
1.11-1.14 -> 1.07, 256->256 at 14x14 0.99-1.01 -> 0.97; 512->512 at 28x28 1.16-1.25 ->
1.12-1.21, 2304 -> 4608 1.14-1.15 -> 1.11-1.13; at 14x14 1.20-1.21 -> 1.10-1.14 (2304),
1.17-1.19 -> 1.14 (2304 -> 4608). In the models, one process, 1152 -> 4608: VGG-19
1.143 -> 1.106, ResNet-50 1.101 -> 1.102, Inception v2 1.098 -> 1.093."""


def _check(params: Params, lanes: int, geo: Geometry) -> None:
    problems = []
    if params.nr % lanes or params.nr <= 0:
        problems.append(f"nr={params.nr} must be a positive multiple of the SIMD width {lanes}")
    if params.packa not in (0, 1):
        problems.append(f"packa={params.packa} must be 0 or 1")
    if params.prefetch not in (0, 1):
        problems.append(f"prefetch={params.prefetch} must be 0 or 1")
    if params.packb not in (0, 1):
        problems.append(f"packb={params.packb} must be 0 or 1")
    elif params.packb == 0 and b_row_stride(geo) is None:
        taps = b_taps(geo)
        if taps is None:
            problems.append(
                "packb=0 needs B contiguous along the columns and evenly strided along k "
                "(a 1x1 convolution or a MatMul), or a padded stride-1 Conv whose output "
                "rows are as long as its input rows"
            )
        elif params.kc % taps.count:
            problems.append(
                f"kc={params.kc}: reading a Conv's input in place (packb=0) takes whole "
                f"windows, so kc must be a multiple of the {taps.count} taps per channel"
            )
    if scratch_bytes(params) > SCRATCH_BYTES:
        problems.append(
            f"kc={params.kc}, nc={params.nc}, mc={params.mc}: the packed blocks "
            f"({scratch_bytes(params) >> 10} KB) must fit in {SCRATCH_BYTES >> 20} MB of stack"
        )
    for name in ("mr", "kc", "mc", "nc", "unroll"):
        if getattr(params, name) < 1:
            problems.append(f"{name}={getattr(params, name)} must be at least 1")
    if params.mr > 16:
        problems.append(f"mr={params.mr}: at most 16 rows of accumulators")
    if params.split not in ("none", "rows", "cols"):
        problems.append(f"split={params.split!r} must be 'none', 'rows' or 'cols'")
    if problems:
        raise ScheduleError("ukernel: " + "; ".join(problems))


def with_ukernel(
    state: State, statement: str, geo: Geometry, params: Params, buffers: Mapping[str, Buffer]
) -> State | None:
    """``state`` with ``statement`` in micro-kernel order and marked (None if illegal);
    epilogue statements (module docstring of krnl/epilogue.py) that the micro-kernel can
    apply in registers are fused under the mark, the other statements run as SIMD loops."""
    order = [*geo.outer, geo.row, *geo.cols, *geo.depth]
    loops = tuple(Var(f"{geo.dims[d]}_g", geo.dims[d]) for d in order)
    state = state.with_nests(
        tuple(Nest(statement, loops) if n.statement == statement else n for n in state.nests)
    )
    host = state.statement(statement)
    shared = len(geo.outer) + 1 + len(geo.cols)
    fused = epilogue_statements(state.kernel, host, geo, buffers)
    init = prologue_statement(state.kernel, host, geo, buffers)
    for tail in [init] * (init is not None) + fused:
        nest = Nest(tail.name, tuple(_epilogue_var(host, tail, v) for v in loops[:shared]))
        state = state.with_attach(tail.name, statement, shared - 1, nest)
    deps = dependences(state.kernel)
    if broken_order(state, deps) is not None:
        return None
    for nest in state.nests:  # the other statements (the init) run as SIMD loops
        if nest.statement in state.attach or nest.statement == statement:
            continue
        state = _default_loops(state, deps, state.statement(nest.statement), buffers)
    return state.with_mark(loops[len(geo.outer)].name, params.mark())


def _default_loops(state: State, deps, stmt: Statement, buffers) -> State:
    """``stmt`` in its default loop nest (coalesced, innermost in SIMD) where legal."""
    plan = loop_nest(stmt, buffers)
    if not plan.order:
        return state
    loops = tuple(Var(loop_name(e), e) for e in plan.order)
    moved = state.with_nests(
        tuple(Nest(stmt.name, loops) if n.statement == stmt.name else n for n in state.nests)
    )
    if broken_order(moved, deps) is not None:
        return state
    if plan.vectorize:
        with contextlib.suppress(ScheduleError):
            moved = annotate.vectorize(moved, deps, loops[-1].name)
    return moved


def epilogue_statements(kernel, host: Statement, geo: Geometry, buffers) -> list[Statement]:
    """The statements after ``host`` that rewrite its output element for element with an
    expression the micro-kernel can compute on a register tile: loads of the output at
    the same element, of other buffers along rows (a bias per channel) or contiguously
    along the columns (a residual), constants, arithmetic, selects and casts."""
    found = []
    after = kernel.statements[kernel.statements.index(host) + 1 :]
    for stmt in after:
        if epilogue_loads(host, stmt, geo, buffers) is None:
            break
        found.append(stmt)
    return found


def prologue_statement(kernel, host: Statement, geo: Geometry, buffers) -> Statement | None:
    """The statement right before ``host`` that initialises its output element for
    element without reading it (zero, a bias, Gemm's C): the micro-kernel starts its
    accumulators from it instead of storing it first and loading it back."""
    index = kernel.statements.index(host)
    if index == 0:
        return None
    init = kernel.statements[index - 1]
    out = host.write.buffer
    if any(ld.access.buffer == out for ld in loads(init.expr)):
        return None
    if epilogue_loads(host, init, geo, buffers) is None:
        return None
    return init


def epilogue_loads(host: Statement, stmt: Statement, geo: Geometry, buffers):
    """{access: (Affine over the host's dims, column step 0 or 1)} of the loads of another
    buffer in epilogue statement ``stmt``, or None when ``stmt`` is not an epilogue."""
    coords = _coordinate_dims(host)
    out = host.write.buffer
    if (
        coords is None
        or stmt.reduce is not None
        or stmt.write.buffer != out
        or not is_whole_identity(stmt, stmt.write.index, buffers[out].shape)
        or not _simple(stmt.expr)
    ):
        return None
    found = {}
    for ld in loads(stmt.expr):
        if ld.access.buffer == out:
            if not is_whole_identity(stmt, ld.access.index, buffers[out].shape):
                return None
            continue
        own = _affine(ld.access.buffer, ld.access.index, buffers)
        if own is None or ld.dtype != "float32":
            return None
        coeffs = [0] * len(geo.dims)
        for p, d in enumerate(coords):
            if d is not None:
                coeffs[d] += own.coeffs[p]
        step = _column_step(coeffs, geo)
        if step is None:
            return None
        found[ld.access] = (Affine(ld.access.buffer, tuple(coeffs), own.const), step)
    return found


def _column_step(coeffs, geo: Geometry) -> int | None:
    """0 or 1 when the offset moves that much per flattened column, else None."""
    step = coeffs[geo.cols[-1]]
    if step not in (0, 1):
        return None
    stride = step
    for d in reversed(geo.cols):
        if coeffs[d] != stride:
            return None
        stride *= geo.sizes[d]
    return step


def _simple(expr) -> bool:
    if isinstance(expr, (Load, Const)):
        return expr.dtype in ("float32", "bool")
    if isinstance(expr, (Unary, Binary, Select, Cast)):
        return all(_simple(x) for x in children(expr))
    return False


def _coordinate_dims(stmt: Statement) -> list[int | None] | None:
    """For each coordinate of the statement's write, the dim it equals (None: always 0)."""
    maff = parse_access(stmt.write.index)
    if any(not _integral(maff.get_aff(r)) for r in range(maff.dim(isl.dim_type.out))):
        return None
    count = maff.dim(isl.dim_type.in_)
    found = []
    for r in range(maff.dim(isl.dim_type.out)):
        aff = maff.get_aff(r)
        if aff.dim(isl.dim_type.div):
            return None
        terms = [
            (d, int(aff.get_coefficient_val(isl.dim_type.in_, d).to_python())) for d in range(count)
        ]
        terms = [(d, c) for d, c in terms if c]
        const = int(aff.get_constant_val().to_python())
        if const:
            return None
        if not terms:
            found.append(None)
        elif len(terms) == 1 and terms[0][1] == 1:
            found.append(terms[0][0])
        else:
            return None
    return found


def _epilogue_var(host: Statement, tail: Statement, loop: Var) -> Var:
    """``loop`` of the host (over host dim ``loop.expr``) as a loop over the tail's dims."""
    coords = _coordinate_dims(host)
    dim = dim_names(host).index(loop.expr)
    names = dim_names(tail)
    for p, d in enumerate(coords):
        if d == dim:
            return Var(loop.name, names[p])
    return Var(loop.name, "0")


def _integral(aff: isl.Aff) -> bool:
    """Integer coefficients and constant (no ``i/2``)."""
    return aff.get_denominator_val().is_one()
