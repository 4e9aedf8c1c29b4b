"""The default ukernel parameters per target (register tile, cache blocks, packing,
prefetch, thread split). The measurements behind the constants are in
docs/measurements.md, 'GEMM defaults'."""

from __future__ import annotations

import dataclasses
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


def panel_blocks(geo: Geometry, params: Params, lanes: int, registers: int) -> Params:
    """``params`` for a GEMM whose B is read from its copy packed when compiling
    (schedule/heuristics/panels.py): the blocks chosen for B read in place from memory,
    ROWS_KC rows at a time, give way to the default K and N blocks, which the contiguous
    copy serves (docs/measurements.md, 'B from its panel copy')."""
    if params.packb or params.kc != ROWS_KC or geo.k <= ROWS_KC:
        return params
    kc = _even(geo.k, AVX512_KC if registers >= 32 and lanes >= 16 else KC, 32)
    return dataclasses.replace(params, kc=kc, nc=_even(geo.n, NC, params.nr))


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
"""AVX2's tile and blocks, for 16 registers (a 6 x 16 tile): MC = 72 rows is twelve
whole 6-row tiles; A of AVX2_PACK_A_BYTES or more is packed into MR-interleaved panels
with column blocks of up to AVX2_PACKED_A_NC; the K loop is unrolled 8 times where B is
packed (a 6 x 16 step is half an 8 x 32 one), 4 where it is read in place; and 4-row tiles
replace 6-row ones that would compute AVX2_ROW_WASTE times the rows. Measured on a Zen 3
(docs/measurements.md, 'AVX2 tile and blocks')."""


AVX2_PREFETCH_A_BYTES = 1 << 17
"""From this size (a quarter of a Zen 3's 512 KB L2) an A read in place is prefetched on
AVX2 (``prefetch``; the prefetches take one address each, the base plus the K index and a
constant): below it A stays in cache from one call to the next. A that differs along the
batch dims counts whole, as a Winograd Conv's 16 GEMMs (krnl/ops/winograd.py) read 16
different weight blocks (docs/measurements.md, 'AVX2 prefetch of A')."""


AVX2_PANEL_K = 64
"""On AVX2, a GEMM with B packed and at most this deep takes row blocks of one tile (MC =
MR): a row panel then sweeps every column tile of the block, and its C rows and epilogue
operands (a residual Add's) are MR streams the hardware prefetchers follow, where a
72-row block down one column tile touches lines whose latency a K loop this short does
not hide. At 128 deep it measured slower (docs/measurements.md, 'AVX2 row panels of one
tile')."""

AVX2_PACK_A_COLUMNS = 128
"""Fewer columns than this and A is not packed on AVX2 whatever its size: packing copies
all of A for few FMAs per element (docs/measurements.md, 'AVX2 A packing needs
columns')."""

AVX2_SHALLOW_K = 256
"""Below this depth, a GEMM whose B is packed takes 4-row tiles on AVX2, not 6-row ones;
B read in place keeps 6 rows (docs/measurements.md, 'AVX2 shallow GEMMs take 4-row
tiles')."""


PREFETCH_A_BYTES = 1 << 20
"""From this size (the L2 of the Zen 4 this was measured on) A is prefetched a row panel
ahead by default: it cannot stay in L2 from one call to the next, and a model's weights
come from memory, which the hardware prefetchers do not follow across the MR rows of a
panel (docs/measurements.md, 'AVX-512 prefetch of A')."""


ROW_WASTE = 1.05
"""8-row tiles give way to 6-row ones when they compute this many times the rows that
6-row tiles do (the last tile's extra rows are computed and dropped)
(docs/measurements.md, 'Row waste of 8-row tiles')."""

NARROW_VECTORS = 3
"""With 3 to 4 vectors' worth of columns (48 to 63 on AVX-512), the register tile is 3
vectors wide (8 x 48, 24 accumulators), not 2: one whole tile and a short edge where 2
vectors wide made a whole tile and an edge of 1 to 2 vectors (docs/measurements.md,
'Three-vector register tiles')."""

PACK_ROWS = 32
"""Rows from which packing B pays for itself by default (each packed element is then
read by at least 4 register tiles)."""

SHORT_ROWS = 192
SHORT_DEPTH = 192
"""A GEMM of fewer than SHORT_ROWS rows and at most SHORT_DEPTH deep reads B in place:
packing is a pass that no FMA overlaps, and few row tiles share it. A B of MEMORY_BYTES
or more is packed all the same: read in place, a K x NC strip of it comes from memory a
row at a time (docs/measurements.md, 'Short GEMMs read B in place')."""

STREAM_ROWS = 128
STREAM_BYTES = 1 << 20
"""Up to STREAM_ROWS rows, a B of more than STREAM_BYTES (the L2 of the Zen 4 this was
measured on) but less than MEMORY_BYTES is read in place, not packed: it comes from
memory either way, and packing is then a pass bound by memory that no FMA overlaps,
shared by few row tiles (docs/measurements.md, 'Streamed B')."""

MEMORY_BYTES = 4 << 20
ROWS_KC = 16
ROWS_NC = 4096
"""A B of MEMORY_BYTES or more comes from memory, and a column strip of KC rows at a
time (each row's 128 bytes in another page) is a pattern the prefetchers do not follow.
With PACK_ROWS rows or more it is packed (its rows copied in NC-wide runs), not streamed
in place; with fewer, it is read in place ROWS_KC whole rows (up to ROWS_NC columns) at a
time, side by side (docs/measurements.md, 'B from memory')."""

TAPS_ROWS_BYTES = 1 << 20
"""A Conv read in place with weights (A) of this size or more (more than the L2 of the
Zen 4 this was measured on) splits its rows over threads, not its columns: each thread
then reads half of A, which in a model comes from memory, and B is read in place, so no
packing is duplicated (docs/measurements.md, 'Row split of in-place Convs')."""

TAPS_KC = 2304
"""A padded 3x3 Conv reads its input in place, with the 8 x 2W register tile of any GEMM
(two B vectors and their masks a tap; 8 broadcasts of A) and K blocks of up to TAPS_KC
(B is not packed, so long blocks cost no stack and load C fewer times). The 8 x 2W tile
replaced a 16 x W one on a Zen 5 (docs/measurements.md, 'In-place Conv tile and K
blocks')."""


KC = 512
NC = 512
"""Largest default K and column blocks (measured on MatMul 2048^3, Zen 4)."""

AVX512_KC = 2048
"""Largest default K block with AVX-512's 32 registers: the 8 x 32 tile's B micro-panel
(up to 256 KB) then streams from L2, and C is loaded and stored once where K fits one
block; the column block shrinks so the packed panel fits SCRATCH_BYTES (352 columns at
K = 2048). Measured on a Zen 5 (docs/measurements.md, 'AVX-512 K blocks')."""


def _even(total: int, largest: int, multiple: int) -> int:
    """The block size that cuts ``total`` into the fewest blocks of at most ``largest``,
    all about the same size (a multiple of ``multiple``): 576 -> 2 x 288, not 512 + 64."""
    blocks = max(-(-total // largest), 1)
    return min(round_up(-(-total // blocks), multiple), round_up(total, multiple))


PARALLEL_WORK = 1_000_000
"""Multiply-adds (~10 us of work) from which a contraction is split over threads by
default. One thread runs the whole range as one chunk, so the split costs nothing there;
with the worker pool (emit/pool.py) a few microseconds buy the second core
(docs/measurements.md, 'Threading threshold')."""

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
row tile to the next. It takes K blocks of up to AVX2_PREFETCHED_TAPS_KC taps (every
channel of a 3x3 window up to 512): with B's lines on their way, fewer blocks (C loaded
and stored, the masks worked out, once a block) won over keeping a 72-row block of A in
L2 (docs/measurements.md, 'AVX2 in-place Conv prefetch and K blocks')."""
