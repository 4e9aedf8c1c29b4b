"""The default ukernel parameters per target (register tile, cache blocks, packing,
prefetch, thread split), and the measurements behind them."""

from __future__ import annotations

import math

from polyonnx.schedule.gemm import MIN_COLUMNS, MIN_DEPTH, MIN_ROWS, Geometry, Params, round_up
from polyonnx.schedule.gemm_taps import b_row_stride, b_taps


def vector_registers(lanes: int) -> int:
    """Architectural vector registers of an x86 float32 SIMD width, for callers that know
    only the width: AVX-512 has 32, AVX2 and SSE 16. (aarch64's NEON has 32 of 4 lanes:
    polyonnx/target.py's Target.vector_registers knows the architecture.)"""
    return 32 if lanes >= 16 else 16


def tile_vectors(lanes: int, registers: int) -> int:
    """The B vectors across the default register tile: 2 (AVX-512's 8 x 32, AVX2's
    6 x 16), or NEON_VECTORS where 32 registers hold 4 lanes each."""
    return NEON_VECTORS if registers >= 32 and lanes < 16 else 2


NEON_VECTORS = 3
"""aarch64's NEON has 32 registers of 4 floats: an 8 x 12 tile keeps 24 accumulators,
3 B vectors and the broadcasts of A in them (BLIS's ARMv8 SGEMM kernel is 8 x 12 too);
8 x 16 would need 32 accumulators alone, and 8 x 8 leaves a third of the registers idle.
Its K blocks are KC, not AVX512_KC: the 8 x 12 tile's B micro-panel (24 KB at 512)
stays in a 32 KB L1. Not measured: chosen from the register count."""


def worth_it(geo: Geometry, lanes: int) -> bool:
    """Big enough in every direction for packing and a register tile to pay off."""
    return geo.m >= MIN_ROWS and geo.n >= max(MIN_COLUMNS, lanes) and geo.k >= MIN_DEPTH


def default_params(geo: Geometry, lanes: int, registers: int) -> Params:
    """Register tile from the vector registers (MR x NR/lanes accumulators, NR/lanes B
    vectors and a broadcast A value must fit), K blocks whose B micro-panel stays in L1,
    and the thread split that needs no duplicated packing."""
    mr = min(8 if registers >= 32 else 6, geo.m)  # a short GEMM: all its rows in one tile
    if mr == 8 and round_up(geo.m, 8) >= ROW_WASTE * round_up(geo.m, 6):
        mr = 6  # 34 rows: 6 tiles of 6 (36 rows computed), not 5 of 8 (40)
    if registers < 32 and mr == 6 and round_up(geo.m, 6) >= AVX2_ROW_WASTE * round_up(geo.m, 4):
        mr = 4  # 8 rows: 2 tiles of 4, not 2 of 6 (12 rows computed)
    nr = tile_vectors(lanes, registers) * lanes
    if registers >= 32 and NARROW_VECTORS * lanes <= geo.n < (NARROW_VECTORS + 1) * lanes:
        nr = NARROW_VECTORS * lanes
    kc = _even(geo.k, AVX512_KC if registers >= 32 and lanes >= 16 else KC, 32)
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

NARROW_VECTORS = 3
"""With 3 to 4 vectors' worth of columns (48 to 63 on AVX-512), the register tile is 3
vectors wide (8 x 48, 24 accumulators), not 2: one whole tile and a short edge where 2
vectors wide made a whole tile and an edge of 1 to 2 vectors. The Winograd GEMMs of a
28 x 28 output's 49 tiles, measured on a Zen 5, 1 thread, in alternating rounds with
onnxruntime: F(4x4, 3x3) 128 -> 128 channels 412 -> 387 us a Conv; the 3x3 stride-2 Conv
128 -> 128 at 56 (krnl/ops/winograd_s2.py) 894 -> 835 us."""

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
    return min(round_up(-(-total // blocks), multiple), round_up(total, multiple))


PARALLEL_WORK = 1_000_000
"""Multiply-adds (~10 us of work) from which a contraction is split over threads by
default. One thread runs the whole range as one chunk, so the split costs nothing there;
with the worker pool (emit/pool.py) a few microseconds buy the second core: at 2 threads
light ShuffleNet went 5.5 -> 4.4 ms and SqueezeNet 5.2 -> 4.5 ms against 10M."""

BATCHED_SPLIT_WORK = 10 * PARALLEL_WORK
"""The same for one GEMM of a batch: below it the GEMM is not split, and the batch loop
runs on threads instead (attention's per-head products; see _threads_over_batches in
schedule/heuristics/ukernel.py)."""


SCRATCH_BYTES = 3 << 20
"""Stack room for a thread's packed B block (worker stacks are 4 MB, emit/threads.py)."""


def scratch_bytes(params: Params) -> int:
    """Stack the GEMM's packed blocks take (emit/ukernel.py allocates them)."""
    b_block = (
        params.kc * (-(-params.nc // params.nr) * params.nr + params.nr) if params.packb else 0
    )
    a_block = -(-params.mc // params.mr) * params.mr * params.kc if params.packa else 0
    return 4 * (b_block + a_block)


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
