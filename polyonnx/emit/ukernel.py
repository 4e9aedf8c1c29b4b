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
loads to Bp, and the other row tiles read Bp (``Packing.fuse_packing``). The copy then
runs under that tile's FMAs rather than as a pass of its own (measured: see
docs/measurements.md).

With packb=0, B is not packed but read in place: row by row (a MatMul, a 1x1 Conv), or,
for a padded stride-1 Conv whose output rows are as long as its input rows, a channel a
step with the window's taps unrolled (past ROLLED_TAPS with AVX-512, a loop over tables of
them), each tap's vectors loaded from the input under masks that keep the window inside
the image (a direct convolution; no im2col is ever built).

A constant B (a model's weights) comes packed already, by schedule/heuristics/panels.py when
compiling (``Gemm.panels``): no packing at all, and the micro-panels are read from that
copy (``_Gemm.copy_tile``).

Each C element is loaded, gets its products added in k order and is stored, so the result
is the original loop order's; except in a tile's last 1..DOT_COLUMNS columns past whole
vectors (a 7x7 Conv's 49th), which are dot products along k, summed W at a time and then
across lanes. Split over threads, each thread takes a range of columns
(each packs its own B) or of rows (each packs all of B) through polyonnx_parallel_for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from llvmlite import ir

from polyonnx.emit import ops, threads
from polyonnx.emit.irhelp import (
    DOT_COLUMNS,
    F32,
    I32,
    LINE_FLOATS,
    Vectors,
    at_most,
    i32,
    lesser,
    loop,
)
from polyonnx.emit.llvmtypes import I64, PTR, constant, no_unroll, splat
from polyonnx.emit.packing import Packing
from polyonnx.emit.taps import ColumnTaps, TapLoops, TapRead
from polyonnx.errors import CodegenError
from polyonnx.krnl.ir import Access, Binary, Cast, Const, Load, Select, Statement, Unary
from polyonnx.krnl.params import Dim, Poly
from polyonnx.schedule.gemm import Affine, FittedGemm, Geometry, Params
from polyonnx.schedule.gemm_epilogue import epilogue_loads
from polyonnx.schedule.gemm_taps import b_row_stride, b_taps, tap_span


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
    panels: str | None = None
    """The constant B's copy packed when compiling (schedule/heuristics/panels.py), which the GEMM
    reads instead of packing B."""
    fitted: FittedGemm | None = None
    """A parametric kernel's geometry and epilogue operands (schedule/heuristics/parametric.py)."""

    def operands(self, buffers) -> list[tuple[Statement, Access, Affine, int]]:
        """(statement, access, offset over the contraction's dims, column step) of every
        load of another buffer in the epilogue, in order."""
        if self.fitted is not None:
            return list(self.fitted.operands)
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
    *,
    count: Callable[[Dim], ir.Value] = lambda n: ir.Constant(I64, n),
) -> None:
    """Call (or run on threads) the GEMM of one value of the outer dims, whose values are
    ``outer`` (dim position -> i64). ``count`` emits a size or stride, which for a
    parametric kernel may be a polynomial in its parameters (the rows, the outer strides)."""
    geo, params = gemm.geo, gemm.params
    extra = gemm.operands(buffers)
    operands = [geo.a, geo.b, geo.c, *(affine for _, _, affine, _ in extra)]
    bases = [_base(b, pointers[op.buffer], op, outer, count) for op in operands]
    if gemm.panels is not None:  # the copy starts at B's element (k = 0, n = 0)
        bases[1] = pointers[gemm.panels]
    name = f"{b.function.name}.gemm{len(b.module.globals)}"
    strides = run_time_strides(geo, extra)
    gemm_fn = _gemm_function(b.module, name, gemm, extra, lanes)
    whole = [ir.Constant(I64, 0), count(geo.m), ir.Constant(I64, 0), count(geo.n)]
    stride_values = [count(x) for x in strides]
    if params.split not in ("rows", "cols"):
        b.call(gemm_fn, [*bases, *whole, *stride_values])
        return
    # columns go to threads a vector at a time: the pool cuts the range into one contiguous
    # piece per thread, and whole NR tiles split 196 columns (a 14x14 Conv) 128 + 68 over 2
    # threads, 8 vectors of work against 5; vectors split them 112 + 84, 7 against 6
    step = params.mr if params.split == "rows" else lanes if gemm.panels is None else params.nr
    extent = whole[1] if params.split == "rows" else whole[3]
    body = _chunk_body(
        b.module, name + ".chunk", gemm_fn, split=params.split, step=step, geo=geo,
        pointers=len(bases),
    )  # fmt: skip
    values = [b.ptrtoint(ptr, I64) for ptr in bases] + [whole[1], whole[3], extent]
    values += stride_values
    with b.goto_block(b.function.entry_basic_block):  # once, not per outer iteration
        ctx = b.alloca(I64, ir.Constant(I64, len(values)), "gemm.ctx")
    for k, value in enumerate(values):
        b.store(value, b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64))
    chunks = b.sdiv(b.add(extent, ir.Constant(I64, step - 1)), ir.Constant(I64, step))
    b.call(threads.parallel_for(b.module), [body, ctx, ir.Constant(I64, 0), chunks])


def _base(b: ir.IRBuilder, pointer: ir.Value, op, outer: dict[int, ir.Value], count) -> ir.Value:
    """``pointer`` advanced by the operand's offset at (outer dims, every other dim 0);
    it may point before the buffer (a padded Conv's B), only in-domain reads dereference."""
    offset = ir.Constant(I64, op.const)
    for d, value in outer.items():
        if op.coeffs[d]:
            offset = b.add(offset, b.mul(value, count(op.coeffs[d])))
    return b.gep(pointer, [offset], source_etype=F32)


def _chunk_body(
    module: ir.Module,
    name: str,
    gemm: ir.Function,
    *,
    split: str,
    step: int,
    geo: Geometry,
    pointers: int,
) -> ir.Function:
    """``body(ctx, lo, hi)``: chunks lo..hi (inclusive) of ``step`` rows or columns
    (split along ``split``: "rows" or "cols"), each a call of ``gemm``. ``ctx`` holds the
    operands' pointers, then the row and column counts and the extent split, then the
    run-time sizes and strides (:func:`run_time_strides`: a parametric GEMM's may be)."""
    fn = ir.Function(module, threads.BODY_TYPE, name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx, lo, hi = fn.args
    count = pointers
    strides = len(gemm.args) - 4 - pointers
    words = [b.load(b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64), typ=I64)
             for k in range(count + 3 + strides)]  # fmt: skip
    ptrs = [b.inttoptr(word, PTR) for word in words[:count]]
    rows, cols, extent = words[count : count + 3]
    start = b.mul(lo, ir.Constant(I64, step))
    stop = lesser(b, b.mul(b.add(hi, ir.Constant(I64, 1)), ir.Constant(I64, step)), extent)
    if split == "rows":
        ranges = [start, stop, ir.Constant(I64, 0), cols]
    else:
        ranges = [ir.Constant(I64, 0), rows, start, stop]
    b.call(gemm, [*ptrs, *ranges, *words[count + 3 :]])
    b.ret_void()
    return fn


# ---- the GEMM function ----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Scratch:
    """The GEMM function's stack buffers (allocated once, in its entry block)."""

    b_panel: ir.Value | None
    """B's KC x NCP block packed a micro-panel after another, or None (B read in place, or
    its copy packed when compiling)."""
    a_panel: ir.Value | None
    """A's MC x KC block packed MR rows interleaved, or None (A read in place)."""
    fused: bool
    """The block's first row tile packs B as it computes (``Packing.fuse_packing``)."""
    bt: ir.Value | None
    """B's last 1..DOT_COLUMNS columns of a tile, one row of ``kcp`` floats a column
    (``_Gemm.dot_columns``), or None (A packed, or no tile ends in so few columns)."""
    kcp: int
    """The floats of a row of ``bt`` (KC rounded up to whole vectors, plus one), or 0."""


@dataclass(frozen=True, eq=False)
class Block:
    """One (NC, KC) block of the loops: columns from ``jc`` (``nc`` of them), reduction
    rows from ``kc`` (``k_len`` of them)."""

    jc: ir.Value
    nc: ir.Value
    kc: ir.Value
    k_len: ir.Value
    starting: ir.Value
    """Whether this is the first K block: the prologue initialises the accumulators."""
    finishing: ir.Value
    """Whether this is the last K block: the epilogue finishes the accumulators."""


@dataclass(frozen=True, eq=False)
class ColumnTile:
    """The NR columns from ``jr`` of a block, shared by its row tiles."""

    jr: ir.Value
    cols: ir.Value
    """How many of its NR columns hold data (NR, or fewer in the block's last tile)."""
    masks: tuple[ir.Value, ...]
    """Per vector of NR, the lanes that hold columns."""
    first: ir.Value
    """Whether this is a row panel's first column tile (jr = 0): A comes from memory."""
    dot: ir.Value | None
    """Whether this tile ends in 1..DOT_COLUMNS columns past whole vectors (dot products,
    ``_Gemm.dot_columns``), or None where no tile can."""
    taps: ColumnTaps | None
    """Its whole tiles' tap masks (emit/taps.py) where B is a Conv's input read in place."""


@dataclass(frozen=True, eq=False)
class BRead:
    """How a tile reads B: ``in_place`` (B itself, ``ldb`` floats a k, under the tile's
    column masks: a partial tile's missing columns are not read), else a packed
    micro-panel (whole, aligned NR tiles). ``store``: while B is read in place, the packed
    micro-panel each loaded vector is also stored to (``Scratch.fused``)."""

    in_place: bool
    store: ir.Value | None = None


@dataclass(frozen=True, eq=False)
class RowTile:
    """One MR x NR register tile: rows from ``row`` (those at ``row_end`` or past it are
    computed again from the last row and not stored) of a column tile."""

    block: Block
    column: ColumnTile
    row: ir.Value
    row_end: ir.Value
    col: ir.Value
    """The tile's first column (jc + jr)."""
    a_at: ir.Value
    """A at column kc (A in place)."""
    b_at: ir.Value
    """B's rows kc.. at the tile's first column: in place, its packed micro-panel or its
    copy packed when compiling."""
    c_at: ir.Value
    """C at the tile's first column, row 0."""
    packed: ir.Value | None
    """The tile's MR interleaved rows in A's packed panel, or None (A in place)."""
    b_read: BRead


def run_time_strides(geo: Geometry, extra) -> list[Poly]:
    """The depth, the columns, B's row stride and the row strides of A, C and the
    epilogue operands that are polynomials in a parametric kernel's parameters
    (distinct, in order): the GEMM function takes their values after its ranges."""
    found = [geo.k, geo.n, b_row_stride(geo), geo.lda, geo.ldc]
    found += [affine.coeffs[geo.row] for _, _, affine, _ in extra]
    return list(dict.fromkeys(x for x in found if isinstance(x, Poly)))


def _gemm_function(module, name, gemm: Gemm, extra, lanes: int) -> ir.Function:
    geo, params = gemm.geo, gemm.params
    strides = run_time_strides(geo, extra)
    pointers = 3 + len(extra)
    signature = ir.FunctionType(ir.VoidType(), [PTR] * pointers + [I64] * (4 + len(strides)))
    fn = ir.Function(module, signature, name)
    for arg in fn.args[:2]:  # not C: an epilogue operand may share its storage (in place)
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    operands = {
        (tail.name, acc): (ptr, affine, step)
        for (tail, acc, affine, step), ptr in zip(extra, fn.args[3:pointers], strict=True)
    }
    values = dict(zip(strides, fn.args[pointers + 4 :], strict=True))
    g = _Gemm(b, gemm, lanes, operands, values)
    scratch = g.allocate_scratch()
    i_lo, i_hi, j_lo, j_hi = fn.args[pointers : pointers + 4]
    with loop(b, j_lo, j_hi, params.nc, "jc") as jc:
        nc = at_most(b, b.sub(j_hi, jc), params.nc)
        depth = g.stride(geo.k)
        with loop(b, ir.Constant(I64, 0), depth, params.kc, "kc") as kc:
            kcl = at_most(b, b.sub(depth, kc), params.kc)
            finishing = b.icmp_signed("==", b.add(kc, kcl), depth)
            starting = b.icmp_signed("==", kc, ir.Constant(I64, 0))
            block = Block(jc, nc, kc, kcl, starting=starting, finishing=finishing)
            _block(g, fn, scratch, block, rows=(i_lo, i_hi))
    b.ret_void()
    return fn


def _block(g: _Gemm, fn: ir.Function, scratch: Scratch, block: Block, *, rows) -> None:
    """One (NC, KC) block: B packed (unless fused or read in place), then its MC row
    blocks, A packed in each where it is, and their column tiles."""
    b, params = g.b, g.p
    a, bmat = fn.args[:2]
    i_lo, i_hi = rows
    if scratch.b_panel is not None and not scratch.fused:
        g.packing.pack_b(scratch.b_panel, bmat, block.kc, block.k_len, block.jc, block.nc)
    with loop(b, i_lo, i_hi, params.mc, "ic") as ic:
        ie = lesser(b, b.add(ic, ir.Constant(I64, params.mc)), i_hi)
        if scratch.a_panel is not None:
            g.packing.pack_a(scratch.a_panel, a, ic, ie, block.kc, block.k_len)
        with loop(b, ir.Constant(I64, 0), block.nc, params.nr, "jr") as jr:
            column = _column_tile(g, bmat, scratch, block, jr)
            with loop(b, ic, ie, params.mr, "ir") as ir_:
                _row_tile(g, fn, scratch, block, column, rows=(i_lo, ic, ir_, ie))


def _column_tile(
    g: _Gemm, bmat: ir.Value, scratch: Scratch, block: Block, jr: ir.Value
) -> ColumnTile:
    """The column tile's masks and tap masks, and where its last columns are dot
    products, B's columns past whole vectors copied contiguous (``Scratch.bt``)."""
    b, params, lanes = g.b, g.p, g.w
    jc, kc, kcl = block.jc, block.kc, block.k_len
    cols = at_most(b, b.sub(block.nc, jr), params.nr)
    first = b.icmp_signed("==", jr, ir.Constant(I64, 0))
    masks = g.column_masks(cols)
    # a whole tile's tap masks, once for all its row tiles, not a row tile each (see
    # docs/measurements.md)
    taps = g.tap_loops.column_taps(b.add(jc, jr)) if g.tap_loops is not None else None
    if scratch.bt is None:
        return ColumnTile(jr, cols, tuple(masks), first, dot=None, taps=taps)
    rest = b.urem(cols, ir.Constant(I64, lanes))
    dot = b.and_(
        b.icmp_signed(">", rest, ir.Constant(I64, 0)),
        b.icmp_signed("<=", rest, ir.Constant(I64, DOT_COLUMNS)),
    )
    if scratch.b_panel is not None:
        src, step = g.packing.panel_tile(scratch.b_panel, jr), params.nr
    elif g.panels:
        src, step = g.copy_tile(bmat, kc, b.add(jc, jr)), params.nr
    else:
        src, step = b.gep(bmat, [g.b_first(kc, b.add(jc, jr))], source_etype=F32), g.ldb
    with b.if_then(dot):
        if g.taps is None:
            g.fill_columns(src, step, b.sub(cols, rest), rest, kcl, scratch=scratch)
        else:
            g.tap_loops.fill_taps(
                src, b.add(jc, jr), b.sub(cols, rest), rest, kcl, bt=scratch.bt, kcp=scratch.kcp
            )
    return ColumnTile(jr, cols, tuple(masks), first, dot=dot, taps=taps)


def _row_tile(
    g: _Gemm, fn: ir.Function, scratch: Scratch, block: Block, column: ColumnTile, *, rows
) -> None:
    """One row tile of a column tile: where B is packed as it is computed, the block's
    first row tile reads B in place and stores it to the panel, the others read the
    panel."""
    b, params = g.b, g.p
    a, bmat, c = fn.args[:3]
    i_lo, ic, ir_, ie = rows
    jc, jr, kc, kcl = block.jc, column.jr, block.kc, block.k_len
    a_at = b.gep(a, [kc], source_etype=F32)
    c_at = b.gep(c, [b.add(jc, jr)], source_etype=F32)
    if scratch.b_panel is not None:
        b_at = g.packing.panel_tile(scratch.b_panel, jr)
    elif g.panels:
        b_at = g.copy_tile(bmat, kc, b.add(jc, jr))
    else:  # B in place
        b_at = b.gep(bmat, [g.b_first(kc, b.add(jc, jr))], source_etype=F32)
    packed = None
    if scratch.a_panel is not None:
        index = b.sdiv(b.sub(ir_, ic), ir.Constant(I64, params.mr))
        size = b.mul(kcl, ir.Constant(I64, params.mr))
        packed = b.gep(scratch.a_panel, [b.mul(index, size)], source_etype=F32)
    in_place = scratch.b_panel is None and not g.panels
    tile = RowTile(
        block=block,
        column=column,
        row=ir_,
        row_end=ie,
        col=b.add(jc, jr),
        a_at=a_at,
        b_at=b_at,
        c_at=c_at,
        packed=packed,
        b_read=BRead(in_place),
    )
    if not scratch.fused:
        g.edge_tiles(tile, scratch=scratch)
        return
    first = b.and_(b.icmp_signed("==", ic, i_lo), b.icmp_signed("==", ir_, ic))
    with b.if_else(first) as (then, otherwise):
        with then:  # B in place, its vectors stored to the panel too
            b_src = b.gep(bmat, [g.b_first(kc, b.add(jc, jr))], source_etype=F32)
            g.edge_tiles(replace(tile, b_at=b_src, b_read=BRead(True, store=b_at)), scratch=scratch)
        with otherwise:
            g.edge_tiles(tile, scratch=scratch)


class _Gemm:
    """The GEMM function's builder and what stays fixed while it is built: the geometry,
    parameters, epilogue, operands and intrinsics. What changes from tile to tile comes in
    as arguments (``Block``, ``ColumnTile``, ``RowTile``)."""

    def __init__(self, b: ir.IRBuilder, gemm: Gemm, lanes: int, operands: dict, strides: dict):
        geo, params = gemm.geo, gemm.params
        self.b, self.geo, self.p, self.w = b, geo, params, lanes
        self.strides = strides
        """Run-time row strides (:func:`run_time_strides`) -> the function's argument."""
        self.panels = gemm.panels is not None
        """B is the copy packed when compiling (``copy_tile``)."""
        self.epilogue = gemm.epilogue
        self.prologue = gemm.prologue
        self.out = gemm.stmt.write.buffer
        self.extra = operands
        """(epilogue statement name, access) -> (pointer, offset, column step)."""
        self.whole_rows = (
            isinstance(geo.m, int) and geo.m % params.mr == 0 and params.mc % params.mr == 0
        )
        """Every row tile is whole (MR divides M and MC; thread splits are whole tiles):
        no clamped rows, no checks before storing them."""
        self.ldb = b_row_stride(geo) or 0
        in_place = not params.packb and not self.ldb and not self.panels
        self.taps = b_taps(geo) if in_place else None
        """B read in place from a padded Conv's input, a window of taps a channel."""
        self.nr_vectors = params.nr // lanes
        """Vectors of a whole tile's row (NR / W); a tile being emitted has as many as its
        column masks (fewer in a partial tile, one for a dot product column)."""
        self.ncp = -(-params.nc // params.nr) * params.nr + params.nr
        """Packed panel width: whole NR tiles plus one (room to zero a partial one). The
        panel is stored a micro-panel at a time: column j of row k at
        ``(j // NR) * KC * NR + k * NR + j % NR``, so that the micro-kernel reads B
        contiguously, a line or two per k, and not one line a page apart per k."""
        self.v = Vectors.declare(b, lanes, multiply_add=multiply_add(b.module))
        """The IR builder's vector types, intrinsics and constants."""
        self.packing = Packing(self.v, geo, params, self.ldb, self.stride)
        self.tap_loops = (
            TapLoops(self.v, geo, params, self.taps, tap_span(geo, self.taps))
            if self.taps is not None
            else None
        )
        """The tap loops where B is a Conv's input read in place (``taps``), else None."""

    def stride(self, value: Dim) -> ir.Value:
        """A row stride as an i64: a constant, or the GEMM function's argument."""
        return self.strides[value] if isinstance(value, Poly) else ir.Constant(I64, value)

    def allocate_scratch(self) -> Scratch:
        """The stack buffers, in the entry block: B's packed panel, the dot products'
        columns (``bt``, where A is read in place and a tile may end in a few columns
        past whole vectors: see ``dot_columns``), A's packed panel."""
        b, params, lanes = self.b, self.p, self.w
        b_panel = None
        if params.packb and not self.panels:
            b_panel = b.alloca(F32, ir.Constant(I64, params.kc * self.ncp), "bp")
            b_panel.align = 64
        # columns past whole vectors: at N's end (any, where N is a run-time value), or
        # every block
        ends = self.geo.n % lanes if isinstance(self.geo.n, int) else 1
        bt, kcp = None, 0
        if not params.packa and (0 < ends <= DOT_COLUMNS or params.nc % lanes):
            kcp = -(-params.kc // lanes) * lanes + lanes
            bt = b.alloca(F32, ir.Constant(I64, DOT_COLUMNS * kcp), "bt")
            bt.align = 64
        a_panel = None
        if params.packa:
            rows = -(-params.mc // params.mr) * params.mr
            a_panel = b.alloca(F32, ir.Constant(I64, rows * params.kc), "ap")
            a_panel.align = 64
        fused = b_panel is not None and self.packing.fuse_packing(dot_columns=bt is not None)
        return Scratch(b_panel, a_panel, fused, bt=bt, kcp=kcp)

    def copy_tile(self, copy: ir.Value, kc: ir.Value, col: ir.Value) -> ir.Value:
        """The micro-panel of columns ``col ..`` (a multiple of NR) and rows ``kc ..`` in
        B's copy packed when compiling: (N / NR, K, NR) panels."""
        b = self.b
        offset = b.add(
            b.mul(col, ir.Constant(I64, self.geo.k)), b.mul(kc, ir.Constant(I64, self.p.nr))
        )
        return b.gep(copy, [offset], source_etype=F32)

    def b_first(self, kc: ir.Value, col: ir.Value) -> ir.Value:
        """Offset of B's element (kc, col) read in place: row k at ``k * ldb``, or with
        taps, channel ``k // taps`` at ``channel * step`` (kc starts a channel)."""
        b = self.b
        if self.taps is None:
            return b.add(b.mul(kc, self.stride(self.ldb)), col)
        channel = b.udiv(kc, ir.Constant(I64, self.taps.count))
        return b.add(b.mul(channel, ir.Constant(I64, self.taps.step)), col)

    # -- masks ---------------------------------------------------------------------------

    def column_masks(self, cols: ir.Value) -> list[ir.Value]:
        return [self.v.below(ir.Constant(I64, v * self.w), cols) for v in range(self.nr_vectors)]

    # -- the micro-kernel ----------------------------------------------------------------

    def edge_tiles(self, tile: RowTile, *, scratch: Scratch) -> None:
        """The tile of ``cols`` columns: the NR-wide micro-kernel, or for the last, partial
        tile, one with only the vectors that hold columns (ceil(cols / W); a 14x14 Conv's
        196 columns are then 13 vectors of work, not 14), or where ``column.dot`` says so,
        the whole vectors and then the last few columns as dot products."""
        b, w, full = self.b, self.w, self.nr_vectors
        cols, masks, dot = tile.column.cols, list(tile.column.masks), tile.column.dot
        if full == 1 and dot is None:
            self.whole_or_masked(tile)
            return
        vectors = b.udiv(b.add(cols, ir.Constant(I64, w - 1)), ir.Constant(I64, w))
        if dot is not None:
            vectors = b.select(dot, b.udiv(cols, ir.Constant(I64, w)), vectors)
        done = b.append_basic_block("tile.done")
        whole = b.append_basic_block("tile.whole")
        switch = b.switch(vectors, whole)
        switch.add_case(ir.Constant(I64, 0), done)
        for nv in [*range(1, full), full]:
            if nv < full:
                block = b.append_basic_block(f"tile.v{nv}")
                switch.add_case(ir.Constant(I64, nv), block)
            else:
                block = whole
            b.position_at_end(block)
            if nv < full:
                self.micro(tile, masks[:nv])
            else:
                self.whole_or_masked(tile)
            b.branch(done)
        b.position_at_end(done)
        if dot is not None:
            with b.if_then(dot):
                at = b.mul(vectors, ir.Constant(I64, w))
                self.dot_columns(
                    tile, col=b.add(tile.col, at), rest=b.sub(cols, at), offset=at, scratch=scratch
                )

    def whole_or_masked(self, tile: RowTile) -> None:
        """The NR-wide micro-kernel twice: for a tile of all NR columns with constant masks
        (LLVM then emits plain loads and stores), else under the column's masks. Masked
        stores are microcoded on Zen 2/3 (AVX2 ``vmaskmovps``; see docs/measurements.md)."""
        b = self.b
        ones = [self.v.all_lanes] * self.nr_vectors
        exact = b.icmp_signed("==", tile.column.cols, ir.Constant(I64, self.p.nr))
        with b.if_else(exact, likely=True) as (then, otherwise):
            with then:
                self.micro(tile, ones)
            with otherwise:
                self.micro(tile, list(tile.column.masks))

    def micro(self, tile: RowTile, masks: list[ir.Value]) -> None:
        """One MR x NR tile of a vector per mask of ``masks``; A read in place
        (``tile.a_at``) or from its packed panel (``tile.packed``: the tile's
        MR-interleaved rows)."""
        kcl = tile.block.k_len
        rows, a_rows, c_rows = self._rows(tile, packed=tile.packed)
        self._prefetch(c_rows, rows, tile.col, vectors=len(masks))
        acc = self._initial(c_rows, rows, masks, tile.col, tile.block.starting)
        taps = self.tap_loops
        if taps is None:
            acc = self._k_loop(acc, a_rows, tile, masks)
        elif all(isinstance(mask, ir.Constant) for mask in masks):  # all NR columns
            acc = taps.inside_or_edge(acc, a_rows, tile.b_at, kcl, tile.column.taps, kernel=self)
        else:
            read = TapRead(taps.tap_masks(tile.col, masks))
            acc = taps.tap_loop(acc, a_rows, tile.b_at, kcl, read, kernel=self)
        self._finish_tile(acc, tile, c_rows=c_rows, rows=rows, masks=masks, col=tile.col)

    def merge(self, tiles):
        """One accumulator tile of phis over ``tiles``: (tile, the block it comes from)."""
        first = tiles[0][0]
        merged = [[self.b.phi(self.v.vec) for _ in row] for row in first]
        for tile, block in tiles:
            for row, phis in zip(tile, merged, strict=True):
                for value, phi in zip(row, phis, strict=True):
                    phi.add_incoming(value, block)
        return merged

    def _rows(self, tile: RowTile, *, packed: ir.Value | None):
        """The tile's rows (past ``row_end``: the last row again, computed but not
        stored), and their A (pointer, step along k; from ``packed`` where not None) and
        C pointers."""
        b, p, geo = self.b, self.p, self.geo
        ir_, a_at, c_at = tile.row, tile.a_at, tile.c_at
        last = b.sub(tile.row_end, ir.Constant(I64, 1))
        a_rows, c_rows, rows = [], [], []
        for r in range(p.mr):
            row = b.add(ir_, ir.Constant(I64, r))
            if not self.whole_rows:
                row = lesser(b, row, last)
            rows.append(row)
            if packed is None:
                at = b.gep(a_at, [b.mul(row, self.stride(geo.lda))], source_etype=F32)
                a_rows.append((at, 1))
            else:
                a_rows.append((self.v.at(packed, r), p.mr))
            c_rows.append(b.gep(c_at, [b.mul(row, self.stride(geo.ldc))], source_etype=F32))
        return rows, a_rows, c_rows

    def _finish_tile(self, acc, tile: RowTile, *, c_rows, rows, masks, col) -> None:
        """Store the accumulators, through the epilogue on the last K block."""
        b, p = self.b, self.p
        ir_, ie = tile.row, tile.row_end
        if not self.epilogue:
            self._store_tile(acc, c_rows, masks, ir_, ie)
            return
        with b.if_else(tile.block.finishing) as (then, otherwise):
            with then:
                done = [
                    [self._finish(acc[r][v], rows[r], col, v, mask) for v, mask in enumerate(masks)]
                    for r in range(p.mr)
                ]
                self._store_tile(done, c_rows, masks, ir_, ie)
            with otherwise:
                self._store_tile(acc, c_rows, masks, ir_, ie)

    def fill_columns(self, src, step: Dim, first, rest, kcl, *, scratch: Scratch) -> None:
        """Copy B's columns ``first .. first + rest`` of this tile (``src``: its column 0,
        ``step`` floats from one k to the next) into ``scratch.bt``, one row per column, each
        zero-padded to a whole vector past ``kcl``."""
        b = self.b
        with loop(b, ir.Constant(I64, 0), rest, 1, "btj") as j:
            row = b.gep(scratch.bt, [b.mul(j, ir.Constant(I64, scratch.kcp))], source_etype=F32)
            column = b.gep(src, [b.add(first, j)], source_etype=F32)
            with loop(b, ir.Constant(I64, 0), kcl, 1, "btk") as k:
                at = b.gep(column, [b.mul(k, self.stride(step))], source_etype=F32)
                value = b.load(at, typ=F32, align=4)
                b.store(value, b.gep(row, [k], source_etype=F32), align=4)
            end = b.gep(row, [kcl], source_etype=F32)
            b.store(self.v.zero, b.bitcast(end, self.v.vec.as_pointer()), align=4)

    def dot_columns(self, tile: RowTile, *, col, rest, offset, scratch: Scratch) -> None:
        """The tile's last ``rest`` (< DOT_COLUMNS + 1) columns from column ``col``: each C
        element a dot product along k of an A row and a B column (copied contiguous into
        ``scratch.bt``), W products a step; where a vector of columns would waste W - rest
        lanes of every FMA (a 7x7 Conv's 49th column took a quarter of the work)."""
        b, w, kcl = self.b, self.w, tile.block.k_len
        rows, a_rows, c_rows = self._rows(tile, packed=None)
        one = ir.Constant(self.v.mask_t, [1] + [0] * (w - 1))
        with loop(b, ir.Constant(I64, 0), rest, 1, "dj") as j:
            at = b.add(col, j)
            c_at_j = [b.gep(c, [b.add(offset, j)], source_etype=F32) for c in c_rows]
            column = b.gep(scratch.bt, [b.mul(j, ir.Constant(I64, scratch.kcp))], source_etype=F32)
            sums = self._dots(a_rows, column, kcl)
            start = self._initial(c_at_j, rows, [one], at, tile.block.starting)
            acc = [[b.fadd(start[r][0], b.insert_element(self.v.zero, sums[r], i32(0)))]
                   for r in range(len(rows))]  # fmt: skip
            self._finish_tile(acc, tile, c_rows=c_at_j, rows=rows, masks=[one], col=at)

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
        accs = [b.phi(self.v.vec) for _ in a_rows]
        for acc in accs:
            acc.add_incoming(self.v.zero, pre)
        b.cbranch(b.icmp_signed("<", k, kcl), body, done)
        b.position_at_end(body)
        mask = self.v.below(k, kcl)
        bv = b.load(b.bitcast(self.v.at(column, k), self.v.vec.as_pointer()), align=4)
        new = []
        for (a_row, _), acc in zip(a_rows, accs, strict=True):
            av = b.call(self.v.mload, [self.v.at(a_row, k), ir.Constant(I32, 4), mask, self.v.zero])
            new.append(b.call(self.v.fma, [av, bv, acc]))
        k.add_incoming(b.add(k, ir.Constant(I64, self.w)), b.block)
        for acc, value in zip(accs, new, strict=True):
            acc.add_incoming(value, b.block)
        b.branch(head)
        b.position_at_end(done)
        return [ops.reduce_lanes(b, "add", acc, "float32") for acc in accs]

    def _prefetch(self, c_rows, rows, col, *, vectors: int) -> None:
        """Ask for the tile's C lines (to write) and its epilogue operands' lines (to read)
        before the K loop, which hides their latency. Each row of the tile is its own
        stream, MR of them a tile, too many for the hardware prefetchers: a 1x1 Conv with
        a residual Add (K = 64) ran at 55% of peak waiting on them. A row's run of
        ``vectors`` vectors may start anywhere in a line (a 14x14 plane is 12.25 lines; a
        numpy array starts 16 bytes into one), so the prefetches go to every line-start
        offset within it and to its last element: a run of 16 floats 16 bytes into a line
        spans two lines, and prefetching from its first two vectors asked for one."""
        b = self.b
        span = vectors * self.w
        offsets = sorted({*range(0, span, LINE_FLOATS), span - 1})
        lines = [(at, 1) for at in c_rows]
        for ptr, affine, step in self.extra.values():
            if step:
                coeff = self.stride(affine.coeffs[self.geo.row])
                lines += [(b.gep(ptr, [b.add(b.mul(row, coeff), col)], source_etype=F32), 0)
                          for row in rows]  # fmt: skip
        for at, write in lines:
            for offset in offsets:
                args = [self.v.at(at, offset), *(ir.Constant(I32, x) for x in (write, 3, 1))]
                b.call(self.v.prefetch, args)

    def _initial(self, c_rows, rows, masks, col, starting: ir.Value):
        """The accumulator tile: C as stored so far, or on the first K block
        (``starting``), the prologue's values (C is not read then)."""
        b, p = self.b, self.p

        def stored():
            return [
                [
                    b.call(
                        self.v.mload,
                        [
                            self.v.at(c_rows[r], v * self.w),
                            ir.Constant(I32, 4),
                            masks[v],
                            self.v.zero,
                        ],
                    )
                    for v in range(len(masks))
                ]
                for r in range(p.mr)
            ]

        if self.prologue is None:
            return stored()
        first = b.append_basic_block("init.first")
        later = b.append_basic_block("init.later")
        merge = b.append_basic_block("init.merge")
        b.cbranch(starting, first, later)
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
                for v in range(len(masks))
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
        return self.merge([(fresh, first_end), (loaded, later_end)])

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
            offset = b.mul(row, self.stride(affine.coeffs[self.geo.row]))
            if step == 0:
                scalar = b.load(b.gep(ptr, [offset], source_etype=F32), typ=F32, align=4)
                return splat(b, scalar, self.w)
            at = b.gep(ptr, [b.add(offset, col)], source_etype=F32)
            return b.call(self.v.mload, [at, ir.Constant(I32, 4), mask, self.v.zero])
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
            store = [
                (acc[r][v], self.v.at(c_rows[r], v * self.w), masks[v]) for v in range(len(masks))
            ]
            if r == 0 or self.whole_rows:
                self._store_all(store)
                continue
            inside = b.icmp_signed("<", b.add(ir_, ir.Constant(I64, r)), ie)
            with b.if_then(inside):
                self._store_all(store)

    def _store_all(self, stores) -> None:
        for value, at, mask in stores:
            self.b.call(self.v.mstore, [value, at, ir.Constant(I32, 4), mask])

    def _k_loop(self, acc, a_rows, tile: RowTile, masks: list[ir.Value]):
        """``for k in 0..kcl`` in steps of ``unroll``, then one at a time; the accumulators
        are loop-carried (phis), so they live in registers."""
        b, kcl = self.b, tile.block.k_len
        unroll = max(self.p.unroll, 1)
        full = b.sub(kcl, b.srem(kcl, ir.Constant(I64, unroll)))

        def ranks(count):
            def body(cur, k):
                for u in range(count):
                    at = b.add(k, ir.Constant(I64, u)) if u else k
                    cur = self._rank1(cur, a_rows, tile, masks, at)
                return cur

            return body

        steps = ranks(unroll)
        a_first, step = a_rows[0]
        if self.p.prefetch and step == 1 and unroll > 1:
            # the next panel's rows on a panel's first column tile, else the rows just read
            panel = b.mul(ir.Constant(I64, self.p.mr), self.stride(self.geo.lda))
            base = self.v.at(a_first, b.select(tile.column.first, panel, ir.Constant(I64, 0)))

            def steps(cur, k):  # the same unrolled step, after its prefetches
                self._prefetch_a(base, k)
                return ranks(unroll)(cur, k)

        acc = self.acc_loop(acc, ir.Constant(I64, 0), full, unroll, "ku", steps)
        return self.acc_loop(acc, full, kcl, 1, "kt", ranks(1))

    def _prefetch_a(self, base, k) -> None:
        """Prefetch into L2 each of MR rows from ``base`` at column ``k``: spread over the
        K loop, the lines of A that a row panel reads in this K block (a line is asked for
        LINE_FLOATS / unroll times). The addresses are ``base`` + k plus constants, so the
        prefetches cost no arithmetic in the loop."""
        b = self.b
        for row in range(self.p.mr):
            offset = b.mul(ir.Constant(I64, row), self.stride(self.geo.lda))
            at = self.v.at(base, b.add(k, offset))
            b.call(self.v.prefetch, [at, *(ir.Constant(I32, x) for x in (0, 2, 1))])

    def acc_loop(self, acc, start, stop, step, name, body, *, rolled=False):
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
        phis = [[b.phi(self.v.vec) for _ in row] for row in acc]
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

    def _rank1(self, acc, a_rows, tile: RowTile, masks: list[ir.Value], k):
        """One k of the tile: its B vectors (in place under ``masks``, or from the packed
        micro-panel), then ``acc[r] += splat(A[r, k]) * B``."""
        b, b_at, store = self.b, tile.b_at, tile.b_read.store
        if not tile.b_read.in_place:  # the packed panel: whole, aligned NR tiles
            row = b.gep(b_at, [b.mul(k, ir.Constant(I64, self.p.nr))], source_etype=F32)
            bv = [
                b.load(self.v.at(row, v * self.w), typ=self.v.vec, align=4 * self.w)
                for v in range(len(masks))
            ]
        else:  # B itself: a partial tile's missing columns are not read
            row = b.gep(b_at, [b.mul(k, self.stride(self.ldb))], source_etype=F32)
            bv = [
                b.call(
                    self.v.mload,
                    [self.v.at(row, v * self.w), ir.Constant(I32, 4), masks[v], self.v.zero],
                )
                for v in range(len(masks))
            ]
            if store is not None:
                at = b.gep(store, [b.mul(k, ir.Constant(I64, self.p.nr))], source_etype=F32)
                for v, value in enumerate(bv):
                    to = b.bitcast(self.v.at(at, v * self.w), self.v.vec.as_pointer())
                    b.store(value, to, align=4 * self.w)
        return self.fma_rows(acc, a_rows, k, bv)

    def fma_rows(self, acc, a_rows, k, bv):
        """``acc[r] += splat(A[r, k]) * bv`` for every row r of the tile."""
        b = self.b
        out = []
        for r, (a_row, step) in enumerate(a_rows):
            at = k if step == 1 else b.mul(k, ir.Constant(I64, step))
            scalar = b.load(b.gep(a_row, [at], source_etype=F32), typ=F32, align=4)
            av = splat(b, scalar, self.w)
            out.append([b.call(self.v.fma, [av, bv[v], acc[r][v]]) for v in range(len(bv))])
        return out


def multiply_add(module: ir.Module) -> str:
    """The micro-kernel's multiply-add intrinsic: ``fma``, but ``fmuladd`` on an x86
    target without FMA (x86-64's SSE2 baseline), where llvm.fma becomes a call of libm's
    fmaf a lane and llvm.fmuladd a multiply and an add (emit/module.py records the
    target's features on the module)."""
    features = getattr(module, "cpu_features", None)
    if features is None or not module.triple.startswith("x86_64"):
        return "fma"
    return "fma" if "+fma" in features.split(",") else "fmuladd"
