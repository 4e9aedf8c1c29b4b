"""The ``ukernel`` mark: a contraction run as packed, cache-tiled GEMM with a register-blocked
micro-kernel (schedule/gemm.py says which statements qualify and why the order is legal).

For one value of the outer dims, ``gemm(A, B, C, i_lo, i_hi, j_lo, j_hi)`` computes rows
[i_lo, i_hi) and columns [j_lo, j_hi) of ``C += A . B``:

    for jc in columns, NC at a time
      for kc in 0..K, KC at a time
        pack B[kc.., jc..] into Bp (KC x NCP floats, row-major; zero where the domain has
                                    no point, e.g. a padded Conv's taps outside the image)
        for ic in rows, MC at a time
          for jr in 0..nc, NR at a time           (the B micro-panel stays in L1)
            for ir in ic..ic+MC, MR at a time     (A is read in place, K-contiguous)
              acc[MR][NR/W] = C tile              (masked columns; rows past the end reuse
              for k: acc += splat(A[r, k]) * Bp[k, jr..]        the last row, unstored)
              C tile = acc

Where B is read a row at a time (a MatMul, a 1x1 Conv: ``ldb``), the block's first row
tile packs it instead, as it computes: it reads B in place and stores each vector it
loads to Bp, and the other row tiles read Bp (``_Gemm.fuse_packing``). The copy then
runs under that tile's FMAs rather than as a pass of its own. Measured on a Zen 5, 1
thread, alternating rounds, time ratios to numpy, a packing pass -> fused: MatMul 1024^3
0.512 -> 0.502, 2048^3 0.515 -> 0.510, 1000^3 0.517 -> 0.505, 512^3 0.510 -> 0.498,
256 x 1024 x 196 0.535 -> 0.527 (4096 x 64 x 4096 alike); light ResNet-50 0.863 -> 0.856
and DenseNet-121 0.741 -> 0.730 times onnxruntime's time. Prefetching B rows ahead in
that tile measured alike (4 to 16 rows).

With packb=0, B is not packed but read in place: row by row (a MatMul, a 1x1 Conv), or,
for a padded stride-1 Conv whose output rows are as long as its input rows, a channel a
step with the window's taps unrolled (past ROLLED_TAPS with AVX-512, a loop over tables of
them), each tap's vectors loaded from the input under masks that keep the window inside
the image (a direct convolution; no im2col is ever built).

Each C element is loaded, gets its products added in k order and is stored, so the result
is the original loop order's; except in a tile's last 1..DOT_COLUMNS columns past whole
vectors (a 7x7 Conv's 49th), which are dot products along k, summed W at a time and then
across lanes. Split over threads, each thread takes a range of columns
(each packs its own B) or of rows (each packs all of B) through polyonnx_parallel_for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from polyonnx.emit import ops, threads
from polyonnx.emit.llvmtypes import I64, PTR, constant, no_unroll, splat
from polyonnx.errors import CodegenError
from polyonnx.krnl.ir import Access, Binary, Cast, Const, Load, Select, Statement, Unary
from polyonnx.schedule.gemm import (
    PREFETCH_CHANNELS,
    Affine,
    Geometry,
    Params,
    b_row_stride,
    b_taps,
    epilogue_loads,
    tap_lines,
    tap_span,
    vector_registers,
)

F32 = ir.FloatType()
I32 = ir.IntType(32)
LINE_FLOATS = 16
"""float32 values in a 64-byte cache line."""

PACK_PREFETCH_ROWS = 3
"""Packing B read row by row prefetches the row this many on (see _prefetch_b_row). Since
the first row tile packs such a B (``fuse_packing``), the packing pass reads it only where
the last columns are dot products. Measured on a Zen 5, 1 thread, against numpy in
alternating rounds, none -> 3 rows on (time ratios to numpy): as a pass for every such B,
MatMul 512 x 512 x 4096 0.539 -> 0.512, 1024^3 0.545 -> 0.527, 2048^3 0.561 -> 0.522 (2 or
8 rows on alike), light ResNet-50 alike (0.876 and 0.879 times onnxruntime's time); with
the fused packing, 1024 x 1024 x 1027 0.516 -> 0.502, 2048 x 2048 x 2051 0.507 -> 0.502."""


@dataclass(frozen=True)
class Gemm:
    """What one ukernel mark computes: the contraction, its parameters, and the epilogue
    statements applied to each finished register tile before it is stored."""

    geo: Geometry
    params: Params
    stmt: Statement
    prologue: Statement | None = None
    """Initialises the accumulators on the first K block (C is not read then)."""
    epilogue: tuple[Statement, ...] = ()
    """Finish each accumulator on the last K block, before the store."""

    def operands(self, buffers) -> list[tuple[Statement, Access, Affine, int]]:
        """(statement, access, offset over the contraction's dims, column step) of every
        load of another buffer in the epilogue, in order."""
        found = []
        for tail in [self.prologue] * (self.prologue is not None) + list(self.epilogue):
            table = epilogue_loads(self.stmt, tail, self.geo, buffers)
            if table is None:
                raise CodegenError(f"{tail.name} cannot be computed in the GEMM's registers")
            found += [(tail, acc, affine, step) for acc, (affine, step) in table.items()]
        return found


def emit_gemm_call(
    b: ir.IRBuilder,
    gemm: Gemm,
    lanes: int,
    pointers: dict[str, ir.Value],
    outer: dict[int, ir.Value],
    buffers,
) -> None:
    """Call (or run on threads) the GEMM of one value of the outer dims, whose values are
    ``outer`` (dim position -> i64)."""
    geo, params = gemm.geo, gemm.params
    extra = gemm.operands(buffers)
    operands = [geo.a, geo.b, geo.c, *(affine for _, _, affine, _ in extra)]
    bases = [_base(b, pointers[op.buffer], op, outer) for op in operands]
    name = f"{b.function.name}.gemm{len(b.module.globals)}"
    gemm_fn = _gemm_function(b.module, name, gemm, extra, lanes)
    whole = [
        ir.Constant(I64, 0),
        ir.Constant(I64, geo.m),
        ir.Constant(I64, 0),
        ir.Constant(I64, geo.n),
    ]
    if params.split not in ("rows", "cols"):
        b.call(gemm_fn, [*bases, *whole])
        return
    # columns go to threads a vector at a time: the pool cuts the range into one contiguous
    # piece per thread, and whole NR tiles split 196 columns (a 14x14 Conv) 128 + 68 over 2
    # threads, 8 vectors of work against 5; vectors split them 112 + 84, 7 against 6
    step = params.mr if params.split == "rows" else lanes
    extent = geo.m if params.split == "rows" else geo.n
    body = _chunk_body(b.module, name + ".chunk", gemm_fn, params.split, step, extent, geo)
    with b.goto_block(b.function.entry_basic_block):  # once, not per outer iteration
        ctx = b.alloca(I64, ir.Constant(I64, len(bases)), "gemm.ctx")
    for k, ptr in enumerate(bases):
        b.store(b.ptrtoint(ptr, I64), b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64))
    chunks = ir.Constant(I64, -(-extent // step))
    b.call(threads.parallel_for(b.module), [body, ctx, ir.Constant(I64, 0), chunks])


def _base(b: ir.IRBuilder, pointer: ir.Value, op, outer: dict[int, ir.Value]) -> ir.Value:
    """``pointer`` advanced by the operand's offset at (outer dims, every other dim 0);
    it may point before the buffer (a padded Conv's B), only in-domain reads dereference."""
    offset = ir.Constant(I64, op.const)
    for d, value in outer.items():
        if op.coeffs[d]:
            offset = b.add(offset, b.mul(value, ir.Constant(I64, op.coeffs[d])))
    return b.gep(pointer, [offset], source_etype=F32)


def _chunk_body(module, name, gemm, split, step, extent, geo) -> ir.Function:
    """``body(ctx, lo, hi)``: chunks lo..hi (inclusive) of ``step`` rows or columns."""
    fn = ir.Function(module, threads.BODY_TYPE, name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx, lo, hi = fn.args
    count = len(gemm.args) - 4
    ptrs = [
        b.inttoptr(b.load(b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64), typ=I64), PTR)
        for k in range(count)
    ]
    start = b.mul(lo, ir.Constant(I64, step))
    stop = _min(b, b.mul(b.add(hi, ir.Constant(I64, 1)), ir.Constant(I64, step)), extent)
    if split == "rows":
        ranges = [start, stop, ir.Constant(I64, 0), ir.Constant(I64, geo.n)]
    else:
        ranges = [ir.Constant(I64, 0), ir.Constant(I64, geo.m), start, stop]
    b.call(gemm, [*ptrs, *ranges])
    b.ret_void()
    return fn


ROLLED_TAPS = 9
"""Windows of more live taps run their taps as a loop (_Gemm._rolled_taps), not unrolled:
unrolled, LLVM hoisted 25 or 49 taps' broadcasts of A and spilled them. Measured on a
Zen 5, 1 thread, ratio to onnxruntime's time: 5x5 Conv 128 -> 128 at 28 x 28 packed 1.18,
in place unrolled 1.37, in place rolled 0.94; the 7x7 stride-2 stem over its phases
(krnl/ops/phases.py) packed 1.19, in place rolled 0.95-0.96. A 3x3 window stays
unrolled: 3x3 stride 2, 128 -> 128 at 56, 1.01 unrolled, 1.11 rolled. With AVX2 the taps
stay unrolled (their masks are vectors there, not bits). As AVX2 code on the Zen 5: the
5x5 Conv 5.15 ms unrolled, 7.76 rolled; the stem 2.02 unrolled, 2.10 rolled, 2.47
packed from its input."""

DOT_COLUMNS = 3
"""A tile's last columns past whole vectors, up to this many, are dot products along k
(_Gemm.dot_columns) rather than one more vector of FMAs with most lanes idle (a 7x7
Conv's 49th column). From 4 columns of 8 lanes the vector is the faster: 1 thread, one
process, ratio to numpy, up to 8 -> up to 3 as dot products: MatMul 127x255x63 (7
columns) 1.15 -> 1.01, 255^3 1.05 -> 1.00, 127x255x60 (4) 1.19 -> 1.11, 255x255x252
1.12 -> 1.03; with 2 or 3 columns, dot products or a vector measured alike (127x255x58
1.16 / 1.21, 127x255x59 1.11 / 1.10); Convs on 14x14 planes (196 = 24 vectors + 4),
ratio to onnxruntime: 3x3 256->256 1.16 -> 1.13, 1x1 1024->256 0.98 -> 0.93."""


# ---- the GEMM function ----------------------------------------------------------------


def _gemm_function(module, name, gemm: Gemm, extra, lanes: int) -> ir.Function:
    geo, params = gemm.geo, gemm.params
    signature = ir.FunctionType(ir.VoidType(), [PTR] * (3 + len(extra)) + [I64] * 4)
    fn = ir.Function(module, signature, name)
    for arg in fn.args[:2]:  # not C: an epilogue operand may share its storage (in place)
        arg.add_attribute("noalias")
    a, bmat, c = fn.args[:3]
    i_lo, i_hi, j_lo, j_hi = fn.args[-4:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    g = _Gemm(b, geo, params, lanes)
    g.epilogue = gemm.epilogue
    g.prologue = gemm.prologue
    g.out = gemm.stmt.write.buffer
    g.extra = {
        (tail.name, acc): (ptr, affine, step)
        for (tail, acc, affine, step), ptr in zip(extra, fn.args[3:-4], strict=True)
    }
    panel = None
    if params.packb:
        panel = b.alloca(F32, ir.Constant(I64, params.kc * g.ncp), "bp")
        panel.align = 64
    ends = geo.n % lanes  # columns past whole vectors: at N's end, or in every NC block
    if not params.packa and (0 < ends <= DOT_COLUMNS or params.nc % lanes):
        # A in place (contiguous along k): see _Gemm.dot_columns
        g.kcp = -(-params.kc // lanes) * lanes + lanes
        g.bt = b.alloca(F32, ir.Constant(I64, DOT_COLUMNS * g.kcp), "bt")
        g.bt.align = 64
    a_panel = None
    if params.packa:
        rows = -(-params.mc // params.mr) * params.mr
        a_panel = b.alloca(F32, ir.Constant(I64, rows * params.kc), "ap")
        a_panel.align = 64
    fused = panel is not None and g.fuse_packing
    with _loop(b, j_lo, j_hi, params.nc, "jc") as jc:
        nc = _min(b, b.sub(j_hi, jc), params.nc)
        with _loop(b, ir.Constant(I64, 0), ir.Constant(I64, geo.k), params.kc, "kc") as kc:
            kcl = _min(b, b.sub(ir.Constant(I64, geo.k), kc), params.kc)
            g.finishing = b.icmp_signed("==", b.add(kc, kcl), ir.Constant(I64, geo.k))
            g.starting = b.icmp_signed("==", kc, ir.Constant(I64, 0))
            if panel is not None and not fused:
                g.pack_b(panel, bmat, kc, kcl, jc, nc)
            with _loop(b, i_lo, i_hi, params.mc, "ic") as ic:
                ie = _min_value(b, b.add(ic, ir.Constant(I64, params.mc)), i_hi)
                if a_panel is not None:
                    g.pack_a(a_panel, a, ic, ie, kc, kcl)
                with _loop(b, ir.Constant(I64, 0), nc, params.nr, "jr") as jr:
                    cols = _min(b, b.sub(nc, jr), params.nr)
                    g.first_tile = b.icmp_signed("==", jr, ir.Constant(I64, 0))
                    masks = g.column_masks(cols)
                    g.b_masks = None if panel is not None else masks
                    if g.bt is not None:
                        rest = b.urem(cols, ir.Constant(I64, lanes))
                        g.dot = b.and_(
                            b.icmp_signed(">", rest, ir.Constant(I64, 0)),
                            b.icmp_signed("<=", rest, ir.Constant(I64, DOT_COLUMNS)),
                        )
                        if panel is not None:
                            src, step = g.panel_tile(panel, jr), params.nr
                        else:
                            first = g.b_first(kc, b.add(jc, jr))
                            src, step = b.gep(bmat, [first], source_etype=F32), g.ldb
                        with b.if_then(g.dot):
                            if g.taps is None:
                                g.fill_columns(src, step, b.sub(cols, rest), rest, kcl)
                            else:
                                g.fill_taps(src, b.add(jc, jr), b.sub(cols, rest), rest, kcl)
                    with _loop(b, ic, ie, params.mr, "ir") as ir_:
                        a_at = b.gep(a, [kc], source_etype=F32)
                        c_at = b.gep(c, [b.add(jc, jr)], source_etype=F32)
                        if panel is not None:
                            b_at = g.panel_tile(panel, jr)
                        else:  # B in place
                            b_at = b.gep(bmat, [g.b_first(kc, b.add(jc, jr))], source_etype=F32)
                        packed = None
                        if a_panel is not None:
                            tile = b.sdiv(b.sub(ir_, ic), ir.Constant(I64, params.mr))
                            size = b.mul(kcl, ir.Constant(I64, params.mr))
                            packed = b.gep(a_panel, [b.mul(tile, size)], source_etype=F32)
                        args = (c_at, ir_, ie, kcl, masks, b.add(jc, jr), packed)
                        if fused:
                            first = b.and_(
                                b.icmp_signed("==", ic, i_lo), b.icmp_signed("==", ir_, ic)
                            )
                            with b.if_else(first) as (then, otherwise):
                                with then:  # B in place, its vectors stored to the panel too
                                    in_place = g.b_first(kc, b.add(jc, jr))
                                    b_src = b.gep(bmat, [in_place], source_etype=F32)
                                    g.b_masks, g.b_store = masks, b_at
                                    g.edge_tiles(cols, a_at, b_src, *args)
                                    g.b_masks, g.b_store = None, None
                                with otherwise:
                                    g.edge_tiles(cols, a_at, b_at, *args)
                        else:
                            g.edge_tiles(cols, a_at, b_at, *args)
    b.ret_void()
    return fn


class _Gemm:
    def __init__(self, b: ir.IRBuilder, geo: Geometry, params: Params, lanes: int):
        self.b, self.geo, self.p, self.w = b, geo, params, lanes
        self.epilogue: tuple[Statement, ...] = ()
        self.out = ""
        self.extra: dict = {}
        self.finishing: ir.Value | None = None
        self.b_masks: list[ir.Value] | None = None
        self.b_store: ir.Value | None = None
        """While B is read in place: the packed micro-panel each loaded vector is also
        stored to (the first row tile packs B as it computes, ``fuse_packing``)."""
        self.whole_rows = geo.m % params.mr == 0 and params.mc % params.mr == 0
        """Every row tile is whole (MR divides M and MC; thread splits are whole tiles):
        no clamped rows, no checks before storing them."""
        self.bt: ir.Value | None = None
        self.kcp = 0
        self.dot: ir.Value | None = None
        """Whether this column tile ends in 1..DOT_COLUMNS columns past whole vectors."""
        self.ldb = b_row_stride(geo) or 0
        self.taps = b_taps(geo) if not params.packb and not self.ldb else None
        """B read in place from a padded Conv's input, a window of taps a channel."""
        self.tap_masks: list[list[ir.Value]] = []
        self.tap_select = False
        """Tap loads read every lane and zero the masked ones (see ``_tap_vector``)."""
        self.tap_tables: list[ir.GlobalVariable] = []
        self.tap_reads = tap_span(geo, self.taps) if self.taps is not None else (0, -1)
        """The lowest and highest offset from a channel's B row that the domain reads."""
        self.starting: ir.Value | None = None
        self.first_tile: ir.Value | None = None
        """Whether this is a row panel's first column tile (jr = 0): A comes from memory."""
        self.prologue: Statement | None = None
        self.vec = ir.VectorType(F32, lanes)
        self.mask_t = ir.VectorType(ir.IntType(1), lanes)
        self.nv = params.nr // lanes
        self.ncp = -(-params.nc // params.nr) * params.nr + params.nr
        """Packed panel width: whole NR tiles plus one (room to zero a partial one). The
        panel is stored a micro-panel at a time: column j of row k at
        ``(j // NR) * KC * NR + k * NR + j % NR``, so that the micro-kernel reads B
        contiguously, a line or two per k, and not one line a page apart per k."""
        module = b.module
        self.fma = _intrinsic(module, f"llvm.fma.v{lanes}f32", self.vec, [self.vec] * 3)
        self.mload = _intrinsic(
            module, f"llvm.masked.load.v{lanes}f32.p0", self.vec, [PTR, I32, self.mask_t, self.vec]
        )
        self.mstore = _intrinsic(
            module,
            f"llvm.masked.store.v{lanes}f32.p0",
            ir.VoidType(),
            [self.vec, PTR, I32, self.mask_t],
        )
        ptrs = ir.VectorType(PTR, lanes)
        self.gather = _intrinsic(
            module,
            f"llvm.masked.gather.v{lanes}f32.v{lanes}p0",
            self.vec,
            [ptrs, I32, self.mask_t, self.vec],
        )
        self.prefetch = _intrinsic(module, "llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        self.zero = ir.Constant(self.vec, [0.0] * lanes)
        self.all_lanes = ir.Constant(self.mask_t, [1] * lanes)
        self.lane_ids = ir.Constant(ir.VectorType(I32, lanes), list(range(lanes)))

    def b_first(self, kc: ir.Value, col: ir.Value) -> ir.Value:
        """Offset of B's element (kc, col) read in place: row k at ``k * ldb``, or with
        taps, channel ``k // taps`` at ``channel * step`` (kc starts a channel)."""
        b = self.b
        if self.taps is None:
            return b.add(b.mul(kc, ir.Constant(I64, self.ldb)), col)
        channel = b.udiv(kc, ir.Constant(I64, self.taps.count))
        return b.add(b.mul(channel, ir.Constant(I64, self.taps.step)), col)

    # -- masks ---------------------------------------------------------------------------

    def below(self, start: ir.Value, limit: ir.Value) -> ir.Value:
        """Lanes l with start + l < limit (i64 scalars)."""
        room = self.b.trunc(self._clamp_room(self.b.sub(limit, start)), I32)
        return self.b.icmp_signed("<", self.lane_ids, splat(self.b, room, self.w))

    def _clamp_room(self, room: ir.Value) -> ir.Value:
        b = self.b
        low = ir.Constant(I64, -1)
        high = ir.Constant(I64, self.w + 1)
        room = b.select(b.icmp_signed("<", room, low), low, room)
        return b.select(b.icmp_signed(">", room, high), high, room)

    def column_masks(self, cols: ir.Value) -> list[ir.Value]:
        return [self.below(ir.Constant(I64, v * self.w), cols) for v in range(self.nv)]

    # -- the micro-kernel ----------------------------------------------------------------

    def edge_tiles(self, cols, a_at, b_at, c_at, ir_, ie, kcl, masks, col, packed) -> None:
        """The tile of ``cols`` columns: the NR-wide micro-kernel, or for the last, partial
        tile, one with only the vectors that hold columns (ceil(cols / W); a 14x14 Conv's
        196 columns are then 13 vectors of work, not 14), or where ``self.dot`` says so,
        the whole vectors and then the last few columns as dot products."""
        b, w, full = self.b, self.w, self.nv
        if full == 1 and self.dot is None:
            self.whole_or_masked(cols, a_at, b_at, c_at, ir_, ie, kcl, masks, col, packed)
            return
        vectors = b.udiv(b.add(cols, ir.Constant(I64, w - 1)), ir.Constant(I64, w))
        if self.dot is not None:
            vectors = b.select(self.dot, b.udiv(cols, ir.Constant(I64, w)), vectors)
        done = b.append_basic_block("tile.done")
        whole = b.append_basic_block("tile.whole")
        switch = b.switch(vectors, whole)
        switch.add_case(ir.Constant(I64, 0), done)
        in_place = self.b_masks is not None
        for nv in [*range(1, full), full]:
            if nv < full:
                block = b.append_basic_block(f"tile.v{nv}")
                switch.add_case(ir.Constant(I64, nv), block)
            else:
                block = whole
            b.position_at_end(block)
            self.nv = nv
            self.b_masks = masks[:nv] if in_place else None
            if nv < full:
                self.micro(a_at, b_at, c_at, ir_, ie, kcl, masks[:nv], col, packed)
            else:
                self.whole_or_masked(cols, a_at, b_at, c_at, ir_, ie, kcl, masks, col, packed)
            b.branch(done)
        self.nv = full
        self.b_masks = masks if in_place else None
        b.position_at_end(done)
        if self.dot is not None:
            with b.if_then(self.dot):
                at = b.mul(vectors, ir.Constant(I64, w))
                self.dot_columns(a_at, c_at, ir_, ie, kcl, b.add(col, at), b.sub(cols, at), at)

    def whole_or_masked(self, cols, a_at, b_at, c_at, ir_, ie, kcl, masks, col, packed):
        """The NR-wide micro-kernel twice: for a tile of all NR columns with constant masks
        (LLVM then emits plain loads and stores), else under ``masks``. Masked stores are
        microcoded on Zen 2/3 (AVX2 ``vmaskmovps``): a 6 x 16 tile's twelve of them took a
        fifth of its time at K = 256."""
        b = self.b
        ones = [self.all_lanes] * self.nv
        in_place = self.b_masks is not None
        exact = b.icmp_signed("==", cols, ir.Constant(I64, self.p.nr))
        with b.if_else(exact, likely=True) as (then, otherwise):
            with then:
                self.b_masks = ones if in_place else None
                self.micro(a_at, b_at, c_at, ir_, ie, kcl, ones, col, packed)
            with otherwise:
                self.b_masks = masks if in_place else None
                self.micro(a_at, b_at, c_at, ir_, ie, kcl, masks, col, packed)

    def micro(self, a_at, b_at, c_at, ir_, ie, kcl, masks, col, packed=None) -> None:
        """One MR x NR tile; A read in place (``a_at``: A at column kc), or from its packed
        panel (``packed``: this tile's MR-interleaved rows)."""
        rows, a_rows, c_rows = self._rows(a_at, c_at, ir_, ie, packed)
        self._prefetch(c_rows, rows, col)
        acc = self._initial(c_rows, rows, masks, col)
        if self.taps is None:
            acc = self._k_loop(acc, a_rows, b_at, kcl)
        elif all(isinstance(mask, ir.Constant) for mask in masks):  # all NR columns
            acc = self._inside_or_edge(acc, a_rows, b_at, kcl, self._tap_masks(col, masks), col)
        else:
            self.tap_masks = self._tap_masks(col, masks)
            acc = self._tap_loop(acc, a_rows, b_at, kcl)
        self._finish_tile(acc, c_rows, rows, masks, col, ir_, ie)

    def _inside_or_edge(self, acc, a_rows, b_at, kcl, tap_masks, col):
        """The tap loop three ways: without masks where every tap's window of every column
        of the tile lies inside the image (most tiles of a wide image); with plain loads
        and ``tap_masks`` zeroing lanes where every tap's row lies within the input
        (``_within_plane``); else with masked loads. With AVX2's 16 registers the masks
        (taps x NR / W) live on the stack, and a masked load then costs a reload: a 3x3
        Conv 64->64 at 56x56 took 4.4 ms masked everywhere against 3.5 ms with no masks."""
        b = self.b
        every = self.all_lanes
        for t in self.taps.live:  # a dead slot's masks are all off
            for mask in tap_masks[t]:
                every = b.and_(every, mask)
        bits = b.bitcast(every, ir.IntType(self.w))
        inside = b.icmp_unsigned("==", bits, ir.Constant(ir.IntType(self.w), (1 << self.w) - 1))
        names = ("inside", "plane", "plane.yes", "edge", "done")
        paths = dict(zip(names, (b.append_basic_block(f"taps.{n}") for n in names), strict=True))
        b.cbranch(inside, paths["inside"], paths["plane"])
        b.position_at_end(paths["plane"])
        b.cbranch(self._within_plane(col), paths["plane.yes"], paths["edge"])
        results = []
        for path, masks, select in [
            ("inside", None, False),
            ("plane.yes", tap_masks, True),
            ("edge", tap_masks, False),
        ]:
            b.position_at_end(paths[path])
            self.tap_masks = masks or [[self.all_lanes] * self.nv for _ in tap_masks]
            self.tap_select = select
            results.append((self._tap_loop(acc, a_rows, b_at, kcl), b.block))
            b.branch(paths["done"])
        self.tap_select = False
        b.position_at_end(paths["done"])
        return self._merge(results)

    def _within_plane(self, col: ir.Value) -> ir.Value:
        """Whether every tap's whole NR-wide row of the tile (first column ``col``) lies
        between the lowest and highest element the domain reads (``tap_span``): then loads
        of all lanes stay inside the input (a lane past an image row reads the next row)
        and only need their values masked."""
        b, taps = self.b, self.taps
        offsets = [taps.offsets[t] for t in taps.live]
        low, high = self.tap_reads
        first = b.add(col, ir.Constant(I64, min(offsets)))
        last = b.add(col, ir.Constant(I64, max(offsets) + self.p.nr - 1))
        return b.and_(
            b.icmp_signed(">=", first, ir.Constant(I64, low)),
            b.icmp_signed("<=", last, ir.Constant(I64, high)),
        )

    def _merge(self, tiles):
        """One accumulator tile of phis over ``tiles``: (tile, the block it comes from)."""
        first = tiles[0][0]
        merged = [[self.b.phi(self.vec) for _ in row] for row in first]
        for tile, block in tiles:
            for row, phis in zip(tile, merged, strict=True):
                for value, phi in zip(row, phis, strict=True):
                    phi.add_incoming(value, block)
        return merged

    def _rows(self, a_at, c_at, ir_, ie, packed):
        """The tile's rows (past ``ie``: the last row again, computed but not stored), and
        their A (pointer, step along k) and C pointers."""
        b, p, geo = self.b, self.p, self.geo
        last = b.sub(ie, ir.Constant(I64, 1))
        a_rows, c_rows, rows = [], [], []
        for r in range(p.mr):
            row = b.add(ir_, ir.Constant(I64, r))
            if not self.whole_rows:
                row = _min_value(b, row, last)
            rows.append(row)
            if packed is None:
                at = b.gep(a_at, [b.mul(row, ir.Constant(I64, geo.lda))], source_etype=F32)
                a_rows.append((at, 1))
            else:
                a_rows.append((self._at(packed, r), p.mr))
            c_rows.append(b.gep(c_at, [b.mul(row, ir.Constant(I64, geo.ldc))], source_etype=F32))
        return rows, a_rows, c_rows

    def _finish_tile(self, acc, c_rows, rows, masks, col, ir_, ie) -> None:
        """Store the accumulators, through the epilogue on the last K block."""
        b, p = self.b, self.p
        if not self.epilogue:
            self._store_tile(acc, c_rows, masks, ir_, ie)
            return
        with b.if_else(self.finishing) as (then, otherwise):
            with then:
                done = [
                    [self._finish(acc[r][v], rows[r], col, v, masks[v]) for v in range(self.nv)]
                    for r in range(p.mr)
                ]
                self._store_tile(done, c_rows, masks, ir_, ie)
            with otherwise:
                self._store_tile(acc, c_rows, masks, ir_, ie)

    def fill_columns(self, src, step: int, first, rest, kcl) -> None:
        """Copy B's columns ``first .. first + rest`` of this tile (``src``: its column 0,
        ``step`` floats from one k to the next) into ``self.bt``, one row per column, each
        zero-padded to a whole vector past ``kcl``."""
        b = self.b
        with _loop(b, ir.Constant(I64, 0), rest, 1, "btj") as j:
            row = b.gep(self.bt, [b.mul(j, ir.Constant(I64, self.kcp))], source_etype=F32)
            column = b.gep(src, [b.add(first, j)], source_etype=F32)
            with _loop(b, ir.Constant(I64, 0), kcl, 1, "btk") as k:
                at = b.gep(column, [b.mul(k, ir.Constant(I64, step))], source_etype=F32)
                value = b.load(at, typ=F32, align=4)
                b.store(value, b.gep(row, [k], source_etype=F32), align=4)
            end = b.gep(row, [kcl], source_etype=F32)
            b.store(self.zero, b.bitcast(end, self.vec.as_pointer()), align=4)

    def fill_taps(self, src, col, first, rest, kcl) -> None:
        """``fill_columns`` for a Conv read in place (``src``: B at this tile's column 0 and
        this K block's first channel, ``col``: the tile's first column): per channel and
        tap, one masked load of the vector at column ``first`` (the window outside the
        image reads 0), its first DOT_COLUMNS lanes stored down the rows of ``self.bt``."""
        b, taps = self.b, self.taps
        full, self.nv = self.nv, 1
        masks = self._tap_masks(b.add(col, first), [self.below(ir.Constant(I64, 0), rest)])
        self.nv = full
        channels = b.udiv(kcl, ir.Constant(I64, taps.count))
        with _loop(b, ir.Constant(I64, 0), channels, 1, "btc") as channel:
            row = b.gep(src, [b.mul(channel, ir.Constant(I64, taps.step))], source_etype=F32)
            k0 = b.mul(channel, ir.Constant(I64, taps.count))
            for t, offset in enumerate(taps.offsets):
                at = self._at(b.gep(row, [first], source_etype=F32), offset)
                value = b.call(self.mload, [at, ir.Constant(I32, 4), masks[t][0], self.zero])
                k = b.add(k0, ir.Constant(I64, t))
                for j in range(DOT_COLUMNS):  # rows past ``rest`` get zeros, never read
                    to = b.add(b.mul(ir.Constant(I64, j), ir.Constant(I64, self.kcp)), k)
                    b.store(b.extract_element(value, _i32(j)), self._at(self.bt, to), align=4)
        with _loop(b, ir.Constant(I64, 0), rest, 1, "btz") as j:
            end = b.add(b.mul(j, ir.Constant(I64, self.kcp)), kcl)
            b.store(self.zero, b.bitcast(self._at(self.bt, end), self.vec.as_pointer()), align=4)

    def dot_columns(self, a_at, c_at, ir_, ie, kcl, col, rest, offset) -> None:
        """The tile's last ``rest`` (< DOT_COLUMNS + 1) columns from column ``col``: each C
        element a dot product along k of an A row and a B column (copied contiguous into
        ``self.bt``), W products a step; where a vector of columns would waste W - rest
        lanes of every FMA (a 7x7 Conv's 49th column took a quarter of the work)."""
        b, w = self.b, self.w
        rows, a_rows, c_rows = self._rows(a_at, c_at, ir_, ie, None)
        one = ir.Constant(self.mask_t, [1] + [0] * (w - 1))
        full, saved = self.nv, self.b_masks
        self.nv = 1
        with _loop(b, ir.Constant(I64, 0), rest, 1, "dj") as j:
            at = b.add(col, j)
            c_at_j = [b.gep(c, [b.add(offset, j)], source_etype=F32) for c in c_rows]
            column = b.gep(self.bt, [b.mul(j, ir.Constant(I64, self.kcp))], source_etype=F32)
            sums = self._dots(a_rows, column, kcl)
            start = self._initial(c_at_j, rows, [one], at)
            acc = [[b.fadd(start[r][0], b.insert_element(self.zero, sums[r], _i32(0)))]
                   for r in range(len(rows))]  # fmt: skip
            self._finish_tile(acc, c_at_j, rows, [one], at, ir_, ie)
        self.nv, self.b_masks = full, saved

    def _dots(self, a_rows, column, kcl) -> list[ir.Value]:
        """Per row, sum over k < kcl of A[row, k] * column[k], W products a step."""
        b = self.b
        pre = b.block
        head = b.append_basic_block("dot.head")
        body = b.append_basic_block("dot.body")
        done = b.append_basic_block("dot.exit")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, "dk")
        k.add_incoming(ir.Constant(I64, 0), pre)
        accs = [b.phi(self.vec) for _ in a_rows]
        for acc in accs:
            acc.add_incoming(self.zero, pre)
        b.cbranch(b.icmp_signed("<", k, kcl), body, done)
        b.position_at_end(body)
        mask = self.below(k, kcl)
        bv = b.load(b.bitcast(self._at(column, k), self.vec.as_pointer()), align=4)
        new = []
        for (a_row, _), acc in zip(a_rows, accs, strict=True):
            av = b.call(self.mload, [self._at(a_row, k), ir.Constant(I32, 4), mask, self.zero])
            new.append(b.call(self.fma, [av, bv, acc]))
        k.add_incoming(b.add(k, ir.Constant(I64, self.w)), b.block)
        for acc, value in zip(accs, new, strict=True):
            acc.add_incoming(value, b.block)
        b.branch(head)
        b.position_at_end(done)
        return [ops.reduce_lanes(b, "add", acc, "float32") for acc in accs]

    def _prefetch(self, c_rows, rows, col) -> None:
        """Ask for the tile's C lines (to write) and its epilogue operands' lines (to read)
        before the K loop, which hides their latency. Each row of the tile is its own
        stream, MR of them a tile, too many for the hardware prefetchers: a 1x1 Conv with
        a residual Add (K = 64) ran at 55% of peak waiting on them. A row's run of
        ``nv`` vectors may start anywhere in a line (a 14x14 plane is 12.25 lines; a
        numpy array starts 16 bytes into one), so the prefetches go to every line-start
        offset within it and to its last element: a run of 16 floats 16 bytes into a line
        spans two lines, and prefetching from its first two vectors asked for one."""
        b = self.b
        span = self.nv * self.w
        offsets = sorted({*range(0, span, LINE_FLOATS), span - 1})
        lines = [(at, 1) for at in c_rows]
        for ptr, affine, step in self.extra.values():
            if step:
                coeff = ir.Constant(I64, affine.coeffs[self.geo.row])
                lines += [(b.gep(ptr, [b.add(b.mul(row, coeff), col)], source_etype=F32), 0)
                          for row in rows]  # fmt: skip
        for at, write in lines:
            for offset in offsets:
                args = [self._at(at, offset), *(ir.Constant(I32, x) for x in (write, 3, 1))]
                b.call(self.prefetch, args)

    def _initial(self, c_rows, rows, masks, col):
        """The accumulator tile: C as stored so far, or on the first K block, the
        prologue's values (C is not read then)."""
        b, p = self.b, self.p

        def stored():
            return [
                [
                    b.call(
                        self.mload,
                        [self._at(c_rows[r], v * self.w), ir.Constant(I32, 4), masks[v], self.zero],
                    )
                    for v in range(self.nv)
                ]
                for r in range(p.mr)
            ]

        if self.prologue is None:
            return stored()
        first = b.append_basic_block("init.first")
        later = b.append_basic_block("init.later")
        merge = b.append_basic_block("init.merge")
        b.cbranch(self.starting, first, later)
        b.position_at_end(first)
        fresh = [
            [
                self._value(
                    self.prologue,
                    self.prologue.expr,
                    None,
                    rows[r],
                    b.add(col, ir.Constant(I64, v * self.w)),
                    masks[v],
                )
                for v in range(self.nv)
            ]
            for r in range(p.mr)
        ]
        first_end = b.block
        b.branch(merge)
        b.position_at_end(later)
        loaded = stored()
        later_end = b.block
        b.branch(merge)
        b.position_at_end(merge)
        return self._merge([(fresh, first_end), (loaded, later_end)])

    def _finish(self, value, row, col, v, mask):
        """The epilogue statements applied to one accumulator vector (row ``row``, columns
        ``col + v*W ..``)."""
        at = self.b.add(col, ir.Constant(I64, v * self.w))
        for tail in self.epilogue:
            value = self._value(tail, tail.expr, value, row, at, mask)
        return value

    def _value(self, tail, expr, current, row, col, mask):
        b = self.b
        if isinstance(expr, Load):
            if expr.access.buffer == self.out:
                return current
            ptr, affine, step = self.extra[(tail.name, expr.access)]
            offset = b.mul(row, ir.Constant(I64, affine.coeffs[self.geo.row]))
            if step == 0:
                scalar = b.load(b.gep(ptr, [offset], source_etype=F32), typ=F32, align=4)
                return splat(b, scalar, self.w)
            at = b.gep(ptr, [b.add(offset, col)], source_etype=F32)
            return b.call(self.mload, [at, ir.Constant(I32, 4), mask, self.zero])
        if isinstance(expr, Const):
            value = constant(expr.dtype, expr.value, self.w)
            return value
        if isinstance(expr, Unary):
            x = self._value(tail, expr.x, current, row, col, mask)
            return ops.unary(b, expr.op, x, expr.x.dtype, expr.dtype)
        if isinstance(expr, Binary):
            x = self._value(tail, expr.a, current, row, col, mask)
            y = self._value(tail, expr.b, current, row, col, mask)
            return ops.binary(b, expr.op, x, y, expr.a.dtype)
        if isinstance(expr, Select):
            cond = self._value(tail, expr.cond, current, row, col, mask)
            x = self._value(tail, expr.a, current, row, col, mask)
            y = self._value(tail, expr.b, current, row, col, mask)
            return b.select(cond, x, y)
        if isinstance(expr, Cast):
            x = self._value(tail, expr.x, current, row, col, mask)
            return ops.cast(b, x, expr.x.dtype, expr.dtype, expr.saturate)
        raise CodegenError(f"cannot compute {expr!r} in a GEMM epilogue")

    def _store_tile(self, acc, c_rows, masks, ir_, ie) -> None:
        b, p = self.b, self.p
        for r in range(p.mr):
            store = [(acc[r][v], self._at(c_rows[r], v * self.w), masks[v]) for v in range(self.nv)]
            if r == 0 or self.whole_rows:
                self._store_all(store)
                continue
            inside = b.icmp_signed("<", b.add(ir_, ir.Constant(I64, r)), ie)
            with b.if_then(inside):
                self._store_all(store)

    def _store_all(self, stores) -> None:
        for value, at, mask in stores:
            self.b.call(self.mstore, [value, at, ir.Constant(I32, 4), mask])

    def _at(self, ptr: ir.Value, offset) -> ir.Value:
        if isinstance(offset, int):
            offset = ir.Constant(I64, offset)
        return self.b.gep(ptr, [offset], source_etype=F32)

    def _k_loop(self, acc, a_rows, b_at, kcl):
        """``for k in 0..kcl`` in steps of ``unroll``, then one at a time; the accumulators
        are loop-carried (phis), so they live in registers."""
        b = self.b
        unroll = max(self.p.unroll, 1)
        full = b.sub(kcl, b.srem(kcl, ir.Constant(I64, unroll)))

        def ranks(count):
            def body(cur, k):
                for u in range(count):
                    cur = self._rank1(cur, a_rows, b_at, b.add(k, ir.Constant(I64, u)) if u else k)
                return cur

            return body

        steps = ranks(unroll)
        a_first, step = a_rows[0]
        if self.p.prefetch and step == 1 and unroll > 1:
            # the next panel's rows on a panel's first column tile, else the rows just read
            panel = ir.Constant(I64, self.p.mr * self.geo.lda)
            base = self._at(a_first, b.select(self.first_tile, panel, ir.Constant(I64, 0)))

            def steps(cur, k):  # the same unrolled step, after its prefetches
                self._prefetch_a(base, k)
                return ranks(unroll)(cur, k)

        acc = self._acc_loop(acc, ir.Constant(I64, 0), full, unroll, "ku", steps)
        return self._acc_loop(acc, full, kcl, 1, "kt", ranks(1))

    def _prefetch_a(self, base, k) -> None:
        """Prefetch into L2 each of MR rows from ``base`` at column ``k``: spread over the
        K loop, the lines of A that a row panel reads in this K block (a line is asked for
        LINE_FLOATS / unroll times). The addresses are ``base`` + k plus constants, so the
        prefetches cost no arithmetic in the loop."""
        b = self.b
        for row in range(self.p.mr):
            at = self._at(base, b.add(k, ir.Constant(I64, row * self.geo.lda)))
            b.call(self.prefetch, [at, *(ir.Constant(I32, x) for x in (0, 2, 1))])

    def _tap_loop(self, acc, a_rows, b_at, kcl):
        """The K loop over a Conv's input read in place: a channel a step, its taps
        unrolled (or rolled, ROLLED_TAPS), each tap's B vectors loaded where its masks say
        the window is inside the image (and the columns inside the tile)."""
        b, taps = self.b, self.taps
        channels = b.udiv(kcl, ir.Constant(I64, taps.count))
        rolled = len(taps.live) > ROLLED_TAPS and vector_registers(self.w) >= 32
        masks = self._mask_table() if rolled else None

        def body(cur, channel):
            row = b.gep(b_at, [b.mul(channel, ir.Constant(I64, taps.step))], source_etype=F32)
            if self.p.prefetch:
                self._prefetch_taps(b_at, channel, channels)
            first = b.mul(channel, ir.Constant(I64, taps.count))
            if rolled:
                return self._rolled_taps(cur, a_rows, row, first, masks)
            for t in taps.live:
                offset = taps.offsets[t]
                bv = [self._tap_vector(row, offset + v * self.w, t, v) for v in range(self.nv)]
                k = b.add(first, ir.Constant(I64, t)) if t else first
                cur = self._fma_rows(cur, a_rows, k, bv)
            return cur

        return self._acc_loop(acc, ir.Constant(I64, 0), channels, 1, "kch", body)

    def _mask_table(self) -> ir.Value | None:
        """The tile's tap masks (``tap_masks``, live taps only) stored to a stack array
        that the rolled tap loop reads, an integer of W bits each; None when every mask
        has all lanes on (the tile lies inside the image)."""
        b, taps = self.b, self.taps
        masks = [self.tap_masks[t][v] for t in taps.live for v in range(self.nv)]
        if all(isinstance(mask, ir.Constant) for mask in masks):
            return None
        bits = ir.IntType(self.w)
        with b.goto_block(b.function.entry_basic_block):
            table = b.alloca(bits, ir.Constant(I64, len(masks)), "tap.masks")
        for i, mask in enumerate(masks):
            b.store(b.bitcast(mask, bits), b.gep(table, [ir.Constant(I64, i)], source_etype=bits))
        return table

    def _rolled_taps(self, acc, a_rows, row, first, masks):
        """A channel's live taps as a loop (not unrolled): each step reads its tap's B
        offset and A column from constant tables, and its masks from ``masks``. Unrolled,
        LLVM schedules a wide window's loads so early that the accumulators spill."""
        b, taps = self.b, self.taps
        live = len(taps.live)
        kind = ir.ArrayType(I64, live)
        tables = self._tap_tables(kind)
        bits = ir.IntType(self.w)

        def step(cur, i):
            offset, tap = (
                b.load(b.gep(t, [ir.Constant(I64, 0), i], source_etype=kind), typ=I64)
                for t in tables
            )
            bv = []
            for v in range(self.nv):
                at = b.gep(row, [b.add(offset, ir.Constant(I64, v * self.w))], source_etype=F32)
                if masks is None:
                    bv.append(b.load(at, typ=self.vec, align=4))
                    continue
                slot = b.add(b.mul(i, ir.Constant(I64, self.nv)), ir.Constant(I64, v))
                word = b.load(b.gep(masks, [slot], source_etype=bits), typ=bits)
                mask = b.bitcast(word, self.mask_t)
                if self.tap_select:
                    bv.append(b.select(mask, b.load(at, typ=self.vec, align=4), self.zero))
                else:
                    bv.append(b.call(self.mload, [at, ir.Constant(I32, 4), mask, self.zero]))
            return self._fma_rows(cur, a_rows, b.add(first, tap), bv)

        stop = ir.Constant(I64, live)
        return self._acc_loop(acc, ir.Constant(I64, 0), stop, 1, "tap", step, rolled=True)

    def _tap_tables(self, kind: ir.ArrayType) -> tuple[ir.GlobalVariable, ...]:
        """The live taps' B offsets and tap numbers as constant arrays, made once a GEMM."""
        if not self.tap_tables:
            module, taps = self.b.module, self.taps
            for values in ([taps.offsets[t] for t in taps.live], list(taps.live)):
                table = ir.GlobalVariable(module, kind, f"taps.{len(module.globals)}")
                table.initializer = ir.Constant(kind, values)
                table.global_constant = True
                table.linkage = "internal"
                self.tap_tables.append(table)
        return tuple(self.tap_tables)

    def _prefetch_taps(self, b_at, channel, channels) -> None:
        """Prefetch into L1 the lines of B this tile reads PREFETCH_CHANNELS channels on
        (the block's last channel where that is past it)."""
        b, last = self.b, self.b.sub(channels, ir.Constant(I64, 1))
        later = _min_value(b, b.add(channel, ir.Constant(I64, PREFETCH_CHANNELS)), last)
        row = b.gep(b_at, [b.mul(later, ir.Constant(I64, self.taps.step))], source_etype=F32)
        for first, end in tap_lines(self.taps, self.p.nr):
            for offset in [*range(first, end, LINE_FLOATS), end]:
                b.call(self.prefetch, [self._at(row, offset), _i32(0), _i32(3), _i32(1)])

    def _tap_vector(self, row, offset: int, tap: int, v: int) -> ir.Value:
        """Vector ``v`` of tap ``tap``'s B row: a masked load, or with ``tap_select`` (the
        row lies in the plane) a plain load and its masked lanes zeroed, an AND whose mask
        can stay in memory: with AVX2's 16 registers a masked load needs its mask in one,
        and a 6x16 tile's accumulators then spill."""
        b, mask = self.b, self.tap_masks[tap][v]
        at = self._at(row, offset)
        if isinstance(mask, ir.Constant):
            return b.load(at, typ=self.vec, align=4)
        if self.tap_select:
            return b.select(mask, b.load(at, typ=self.vec, align=4), self.zero)
        return b.call(self.mload, [at, ir.Constant(I32, 4), mask, self.zero])

    def _tap_masks(self, col: ir.Value, masks: list[ir.Value]) -> list[list[ir.Value]]:
        """Per tap, per vector of the tile (first column ``col``): the lanes whose input
        element lies inside the image, and inside the tile (``masks``)."""
        b, geo, taps = self.b, self.geo, self.taps
        vec32 = ir.VectorType(I32, self.w)
        out = [list(masks[: self.nv]) for _ in taps.offsets]
        for v in range(self.nv):
            first = b.trunc(b.add(col, ir.Constant(I64, v * self.w)), I32)
            flat = b.add(splat(b, first, self.w), self.lane_ids)
            values = {}
            for d in reversed(geo.cols):
                size = ir.Constant(vec32, [geo.sizes[d]] * self.w)
                values[d] = b.urem(flat, size)
                flat = b.udiv(flat, size)
            for columns, bounds in zip(taps.columns, taps.bounds, strict=True):
                part = ir.Constant(vec32, [0] * self.w)
                for d, coeff in zip(geo.cols, columns, strict=True):
                    if coeff:
                        part = b.add(part, b.mul(values[d], ir.Constant(vec32, [coeff] * self.w)))
                for t, bound in enumerate(bounds):
                    inside = b.icmp_signed(">=", part, ir.Constant(vec32, [-bound] * self.w))
                    out[t][v] = b.and_(out[t][v], inside)
        return out

    def _acc_loop(self, acc, start, stop, step, name, body, rolled=False):
        """``for k in start..stop by step: acc = body(acc, k)``, the accumulators
        loop-carried (phis); ``rolled``: LLVM may not unroll it."""
        b = self.b
        pre = b.block
        head = b.append_basic_block(f"{name}.head")
        inner = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.exit")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, name)
        k.add_incoming(start, pre)
        phis = [[b.phi(self.vec) for _ in row] for row in acc]
        for row, prow in zip(acc, phis, strict=True):
            for value, phi in zip(row, prow, strict=True):
                phi.add_incoming(value, pre)
        b.cbranch(b.icmp_signed("<", k, stop), inner, done)
        b.position_at_end(inner)
        cur = body([list(row) for row in phis], k)
        k.add_incoming(b.add(k, ir.Constant(I64, step)), b.block)
        for row, prow in zip(cur, phis, strict=True):
            for value, phi in zip(row, prow, strict=True):
                phi.add_incoming(value, b.block)
        back = b.branch(head)
        if rolled:
            back.set_metadata("llvm.loop", no_unroll(b.module))
        b.position_at_end(done)
        return phis

    def _rank1(self, acc, a_rows, b_at, k):
        b = self.b
        if self.b_masks is None:  # the packed panel: whole, aligned NR tiles
            row = b.gep(b_at, [b.mul(k, ir.Constant(I64, self.p.nr))], source_etype=F32)
            bv = [
                b.load(self._at(row, v * self.w), typ=self.vec, align=4 * self.w)
                for v in range(self.nv)
            ]
        else:  # B itself: a partial tile's missing columns are not read
            row = b.gep(b_at, [b.mul(k, ir.Constant(I64, self.ldb))], source_etype=F32)
            bv = [
                b.call(
                    self.mload,
                    [self._at(row, v * self.w), ir.Constant(I32, 4), self.b_masks[v], self.zero],
                )
                for v in range(self.nv)
            ]
            if self.b_store is not None:
                at = b.gep(self.b_store, [b.mul(k, ir.Constant(I64, self.p.nr))], source_etype=F32)
                for v, value in enumerate(bv):
                    to = b.bitcast(self._at(at, v * self.w), self.vec.as_pointer())
                    b.store(value, to, align=4 * self.w)
        return self._fma_rows(acc, a_rows, k, bv)

    def _fma_rows(self, acc, a_rows, k, bv):
        """``acc[r] += splat(A[r, k]) * bv`` for every row r of the tile."""
        b = self.b
        out = []
        for r, (a_row, step) in enumerate(a_rows):
            at = k if step == 1 else b.mul(k, ir.Constant(I64, step))
            scalar = b.load(b.gep(a_row, [at], source_etype=F32), typ=F32, align=4)
            av = splat(b, scalar, self.w)
            out.append([b.call(self.fma, [av, bv[v], acc[r][v]]) for v in range(self.nv)])
        return out

    # -- packing A -----------------------------------------------------------------------

    def pack_a(self, panel, src, ic, ie, kc, kcl) -> None:
        """Rows ic..ie, columns kc..kc+kcl of A into ``panel``: per MR rows, k-major with
        the MR values of one k side by side (rows past ie repeat the last row). W columns
        at a time: a vector from each row, transposed in registers; the last kcl % W
        columns one value at a time."""
        b, p, geo = self.b, self.p, self.geo
        last = b.sub(ie, ir.Constant(I64, 1))
        whole = b.sub(kcl, b.urem(kcl, ir.Constant(I64, self.w)))
        block_t = ir.VectorType(F32, p.mr * self.w)
        with _loop(b, ic, ie, p.mr, "pa") as start:
            block = b.sdiv(b.sub(start, ic), ir.Constant(I64, p.mr))
            dst = b.gep(panel, [b.mul(block, b.mul(kcl, ir.Constant(I64, p.mr)))], source_etype=F32)
            origins = []
            for r in range(p.mr):
                row = _min_value(b, b.add(start, ir.Constant(I64, r)), last)
                at = b.add(b.mul(row, ir.Constant(I64, geo.lda)), kc)
                origins.append(b.gep(src, [at], source_etype=F32))
            with _loop(b, ir.Constant(I64, 0), whole, self.w, "pav") as k:
                rows = [b.load(self._at(o, k), typ=self.vec, align=4) for o in origins]
                at = self._at(dst, b.mul(k, ir.Constant(I64, p.mr)))
                out = b.bitcast(at, block_t.as_pointer())
                b.store(_transpose(b, rows, self.w), out, align=4)
            for r, origin in enumerate(origins):
                with _loop(b, whole, kcl, 1, f"pa{r}") as k:
                    value = b.load(self._at(origin, k), typ=F32, align=4)
                    at = b.add(b.mul(k, ir.Constant(I64, p.mr)), ir.Constant(I64, r))
                    b.store(value, self._at(dst, at), align=4)

    # -- packing B -----------------------------------------------------------------------

    def pack_b(self, panel, src, kc, kcl, jc, nc) -> None:
        """Rows kc..kc+kcl, columns jc..jc+nc of B into ``panel`` (micro-panel order, see
        ``ncp``), zero where the domain has no point, then zeros up to the next whole NR
        tile."""
        b, geo, nr = self.b, self.geo, self.p.nr
        width = math.prod(geo.sizes[d] for d in self.run_dims)
        with _loop(b, ir.Constant(I64, 0), kcl, 1, "pk") as kk:
            values = _unflatten(b, b.add(kc, kk), [(d, geo.sizes[d]) for d in geo.depth])
            row_off = _dot(b, geo.b.coeffs, values, 0)
            rests = [_dot(b, coeffs, values, const) for coeffs, const in geo.constraints]
            first = b.sdiv(jc, ir.Constant(I64, width))
            last = b.sdiv(b.add(jc, b.sub(nc, ir.Constant(I64, 1))), ir.Constant(I64, width))
            with _loop(b, first, b.add(last, ir.Constant(I64, 1)), 1, "pr") as rho:
                self._pack_run(src, panel, kk, rho, jc, nc, row_off, rests)
            partial = b.urem(nc, ir.Constant(I64, nr))
            tail = b.sub(_round_up(b, nc, nr), nc)
            row = self._panel_at(panel, kk, b.sub(nc, partial), partial)
            # not with no columns to zero: a masked store whose lanes are all off still
            # costs a microcode assist where its page was never touched (the panel's
            # spare micro-panel on a worker's fresh stack)
            with b.if_then(b.icmp_signed(">", partial, ir.Constant(I64, 0))):
                for v in range(self.nv):
                    mask = self.below(ir.Constant(I64, v * self.w), tail)
                    at = self._at(row, v * self.w)
                    b.call(self.mstore, [self.zero, at, _i32(4), mask])

    @property
    def fuse_packing(self) -> bool:
        """Whether the first row tile of a block packs B as it computes: it reads B in
        place a row at a time (``ldb``) and stores each vector it loads to the panel,
        where its FMAs hide the copy, and the other row tiles read the panel. Not with
        the last columns as dot products (their transposed copy comes from the panel)."""
        return bool(self.ldb) and self.bt is None

    @property
    def run_dims(self) -> tuple[int, ...]:
        """The trailing J dims that B reads as one evenly strided run: the innermost, and
        each next one out while B's offset keeps the same step across it and no padding
        constraint names it (a 1x1 Conv's whole output plane, not one row of it). Packing
        copies a run with whole vectors; runs one short row long (27 columns) left most
        vectors split across micro-panels and masked."""
        geo = self.geo
        inner = geo.cols[-1]
        if any(coeffs[inner] for coeffs, _ in geo.constraints):
            return (inner,)
        runs, stride = [inner], geo.b.coeffs[inner] * geo.sizes[inner]
        for d in reversed(geo.cols[:-1]):
            if geo.b.coeffs[d] != stride or any(coeffs[d] for coeffs, _ in geo.constraints):
                break
            runs.insert(0, d)
            stride *= geo.sizes[d]
        return tuple(runs)

    def panel_tile(self, panel, col) -> ir.Value:
        """The packed panel's micro-panel of columns ``col ..`` (a multiple of NR)."""
        return self.b.gep(panel, [self.b.mul(col, ir.Constant(I64, self.p.kc))], source_etype=F32)

    def _panel_at(self, panel, k, tile_col, offset) -> ir.Value:
        """The packed panel at row ``k``, column ``tile_col + offset`` (``tile_col`` a
        multiple of NR, ``offset`` below NR)."""
        b = self.b
        row = b.add(b.mul(k, ir.Constant(I64, self.p.nr)), offset)
        return b.gep(self.panel_tile(panel, tile_col), [row], source_etype=F32)

    def _pack_run(self, src, panel, kk, rho, jc, nc, row_off, rests) -> None:
        """One run of the innermost J dim (fixed outer J dims ``rho``), clipped to the
        column block and to the domain's constraints, into row ``kk`` of the panel."""
        b, geo = self.b, self.geo
        inner = geo.cols[-1]
        runs = self.run_dims
        width = math.prod(geo.sizes[d] for d in runs)
        base = b.mul(rho, ir.Constant(I64, width))
        w0 = _max(b, b.sub(jc, base), 0)
        w1 = _min(b, b.sub(b.add(jc, nc), base), width)
        values = _unflatten(b, rho, [(d, geo.sizes[d]) for d in geo.cols[: -len(runs)]])
        offset = _dot(b, geo.b.coeffs, values, 0, start=row_off)
        lo, hi = w0, w1
        for (coeffs, _), rest in zip(geo.constraints, rests, strict=True):
            rest = _dot(b, coeffs, values, 0, start=rest)
            lo, hi = self._clip(coeffs[inner], rest, lo, hi, w1)
        step = geo.b.coeffs[inner]
        with _loop(b, w0, w1, self.w, "pw") as w:
            at = b.sub(b.add(base, w), jc)  # the panel column
            whole = b.icmp_signed("<=", b.add(w, ir.Constant(I64, self.w)), hi)
            inside = b.and_(b.icmp_signed(">=", w, lo), whole)
            with b.if_else(inside, likely=True) as (then, otherwise):
                with then:  # a whole vector of taps inside the image: no masks
                    if step == 1 and self.ldb:
                        self._prefetch_b_row(src, offset, w)
                    value = self._run_vector(src, offset, w, step, self.all_lanes)
                    self._panel_store(panel, kk, at, value, self.all_lanes)
                with otherwise:  # a run's ends: the padding and the block's edge
                    keep = self.below(w, w1)
                    valid = b.and_(keep, b.and_(self.below(w, hi), b.not_(self.below(w, lo))))
                    value = self._run_vector(src, offset, w, step, valid)
                    self._panel_store(panel, kk, at, value, keep)

    def _prefetch_b_row(self, src, offset, w) -> None:
        """Prefetch into L1 the line of B that packing copies PACK_PREFETCH_ROWS rows on
        (each B row a packed block reads is a short run in another page, whose first lines
        the hardware prefetchers miss; a prefetch past B's end does not fault)."""
        b = self.b
        at = b.gep(src, [b.add(offset, w)], source_etype=F32)
        later = self._at(at, PACK_PREFETCH_ROWS * self.ldb)
        b.call(self.prefetch, [later, _i32(0), _i32(3), _i32(1)])

    def _panel_store(self, panel, k, col, value, mask) -> None:
        """Store the lanes of ``value`` under ``mask`` at row ``k``, columns ``col ..`` of
        the packed panel: one store, or two where the vector crosses into the next
        micro-panel (a Conv's output row that does not start on a vector)."""
        b, nr = self.b, self.p.nr
        offset = b.urem(col, ir.Constant(I64, nr))
        at = self._panel_at(panel, k, b.sub(col, offset), offset)
        fits = b.icmp_unsigned("<=", offset, ir.Constant(I64, nr - self.w))
        with b.if_else(fits, likely=True) as (then, otherwise):
            with then:
                b.call(self.mstore, [value, at, _i32(4), mask])
            with otherwise:
                here = self.below(offset, ir.Constant(I64, nr))
                b.call(self.mstore, [value, at, _i32(4), b.and_(mask, here)])
                # lane l >= NR - offset is column l - (NR - offset) of the next micro-panel
                there = self._at(at, (self.p.kc - 1) * nr)
                spill = b.and_(mask, b.not_(here))
                bits = b.bitcast(spill, ir.IntType(self.w))
                with b.if_then(b.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(self.w), 0))):
                    b.call(self.mstore, [value, there, _i32(4), spill])  # see pack_b

    def _run_vector(self, src, offset, w, step: int, mask) -> ir.Value:
        """Lanes l of ``src[offset + step*(w + l)]`` where ``mask``, else 0."""
        if step == 1:
            at = self.b.gep(src, [self.b.add(offset, w)], source_etype=F32)
            return self.b.call(self.mload, [at, ir.Constant(I32, 4), mask, self.zero])
        if step == 2:
            return self._every_other(src, offset, w, mask)
        return self._gather(src, offset, w, step, mask)

    def _clip(self, a: int, rest, lo, hi, w1):
        """Narrow [lo, hi) to the w with ``a*w + rest >= 0``."""
        b = self.b
        if a > 0:  # w >= ceil(-rest / a)
            return _max_value(b, lo, b.sub(ir.Constant(I64, 0), _floor_div(b, rest, a))), hi
        if a < 0:  # w <= floor(rest / -a)
            return lo, _min_value(b, hi, b.add(_floor_div(b, rest, -a), ir.Constant(I64, 1)))
        empty = b.icmp_signed("<", rest, ir.Constant(I64, 0))
        return b.select(empty, w1, lo), hi

    def _every_other(self, src, offset, w, mask) -> ir.Value:
        """Lanes l of ``src[offset + 2*(w + l)]`` (a stride-2 conv's row): two contiguous
        masked loads and one shuffle of their even lanes, instead of a gather."""
        b, lanes = self.b, self.w
        start = b.gep(src, [b.add(offset, b.mul(w, ir.Constant(I64, 2)))], source_etype=F32)
        none = ir.Constant(self.mask_t, [0] * lanes)
        halves = []
        for half in range(2):
            # source lane 2i is destination lane half*lanes/2 + i; odd source lanes unused
            picks = [half * lanes // 2 + i // 2 if i % 2 == 0 else lanes for i in range(lanes)]
            part = b.shuffle_vector(mask, none, ir.Constant(ir.VectorType(I32, lanes), picks))
            at = self._at(start, half * lanes)
            halves.append(b.call(self.mload, [at, ir.Constant(I32, 4), part, self.zero]))
        evens = ir.Constant(ir.VectorType(I32, lanes), list(range(0, 2 * lanes, 2)))
        return b.shuffle_vector(halves[0], halves[1], evens)

    def _gather(self, src, offset, w, step, mask) -> ir.Value:
        b = self.b
        vec64 = ir.VectorType(I64, self.w)
        start = b.ptrtoint(
            b.gep(src, [b.add(offset, b.mul(w, ir.Constant(I64, step)))], source_etype=F32), I64
        )
        lanes = ir.Constant(vec64, [4 * step * lane for lane in range(self.w)])
        ptrs = b.inttoptr(b.add(splat(b, start, self.w), lanes), ir.VectorType(PTR, self.w))
        return b.call(self.gather, [ptrs, ir.Constant(I32, 4), mask, self.zero])


# ---- small IR helpers ------------------------------------------------------------------


class _loop:
    """``for (it = start; it < stop; it += step)``; yields the i64 iterator."""

    def __init__(self, b: ir.IRBuilder, start, stop, step: int, name: str):
        self.b, self.start, self.stop, self.step, self.name = b, start, stop, step, name

    def __enter__(self) -> ir.Value:
        b = self.b
        pre = b.block
        self.head = b.append_basic_block(f"{self.name}.head")
        body = b.append_basic_block(f"{self.name}.body")
        self.exit = b.append_basic_block(f"{self.name}.exit")
        b.branch(self.head)
        b.position_at_end(self.head)
        self.it = b.phi(I64, self.name)
        self.it.add_incoming(self.start, pre)
        b.cbranch(b.icmp_signed("<", self.it, self.stop), body, self.exit)
        b.position_at_end(body)
        return self.it

    def __exit__(self, *exc) -> None:
        b = self.b
        self.it.add_incoming(b.add(self.it, ir.Constant(I64, self.step)), b.block)
        b.branch(self.head)
        b.position_at_end(self.exit)


def _transpose(b: ir.IRBuilder, rows: list[ir.Value], lanes: int) -> ir.Value:
    """The vectors ``rows`` (R of ``lanes`` floats) as one vector of R * lanes, column by
    column: element ``k * R + r`` is lane k of row r. Concatenated pairwise (padded with
    undefined vectors to a power of two), then one permutation."""
    parts = list(rows) + [ir.Constant(rows[0].type, ir.Undefined)] * (
        (1 << (len(rows) - 1).bit_length()) - len(rows)
    )
    while len(parts) > 1:
        size = len(parts[0].type) * 2
        mask = ir.Constant(ir.VectorType(I32, size), list(range(size)))
        parts = [b.shuffle_vector(x, y, mask) for x, y in zip(parts[::2], parts[1::2], strict=True)]
    whole = parts[0]
    order = [r * lanes + k for k in range(lanes) for r in range(len(rows))]
    mask = ir.Constant(ir.VectorType(I32, len(order)), order)
    return b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined), mask)


def _intrinsic(module: ir.Module, name: str, ret, args) -> ir.Function:
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, args), name)


def _unflatten(b: ir.IRBuilder, flat: ir.Value, dims) -> dict[int, ir.Value]:
    """Row-major digits of ``flat`` over ``dims`` ((position, extent), outermost first)."""
    values = {}
    for d, size in reversed(dims):
        if size == 1:
            values[d] = ir.Constant(I64, 0)
            continue
        values[d] = b.srem(flat, ir.Constant(I64, size))
        flat = b.sdiv(flat, ir.Constant(I64, size))
    return values


def _dot(b, coeffs, values: dict[int, ir.Value], const: int, start=None) -> ir.Value:
    total = start if start is not None else ir.Constant(I64, const)
    if start is not None and const:
        total = b.add(total, ir.Constant(I64, const))
    for d, value in values.items():
        if coeffs[d]:
            total = b.add(total, b.mul(value, ir.Constant(I64, coeffs[d])))
    return total


def _floor_div(b: ir.IRBuilder, x: ir.Value, d: int) -> ir.Value:
    """floor(x / d) for a positive constant d."""
    q = b.sdiv(x, ir.Constant(I64, d))
    fix = b.icmp_signed("<", b.srem(x, ir.Constant(I64, d)), ir.Constant(I64, 0))
    return b.sub(q, b.zext(fix, I64))


def _i32(value: int) -> ir.Constant:
    return ir.Constant(I32, value)


def _round_up(b: ir.IRBuilder, x: ir.Value, multiple: int) -> ir.Value:
    m = ir.Constant(I64, multiple)
    return b.mul(b.sdiv(b.add(x, ir.Constant(I64, multiple - 1)), m), m)


def _min(b: ir.IRBuilder, x: ir.Value, limit: int) -> ir.Value:
    return _min_value(b, x, ir.Constant(I64, limit))


def _max(b: ir.IRBuilder, x: ir.Value, limit: int) -> ir.Value:
    return _max_value(b, x, ir.Constant(I64, limit))


def _min_value(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _max_value(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)
