"""The GEMM micro-kernel's K loop over a Conv's input read in place (emit/ukernel.py's
``_Gemm`` with ``taps``; schedule/gemm_taps.py's ``Taps``): a channel a step, each tap's B vectors
loaded from the input under masks that keep the window inside the image. A tile whose every
tap lies inside takes the loop without masks; one whose taps' rows lie in the input plane
loads every lane and zeroes the masked ones; others load under the masks. Up to
ROLLED_TAPS taps are unrolled; with AVX-512 more run as a loop over constant tables of
their offsets, the tile's masks stored to the stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from llvmlite import ir

from polyonnx.emit.irhelp import DOT_COLUMNS, F32, I32, LINE_FLOATS, Vectors, i32, lesser, loop
from polyonnx.emit.llvmtypes import I64, splat
from polyonnx.schedule.gemm import Geometry, Params
from polyonnx.schedule.gemm_taps import PREFETCH_CHANNELS, Taps, tap_lines
from polyonnx.schedule.heuristics.gemm_defaults import vector_registers

ROLLED_TAPS = 9
"""Windows of more live taps run their taps as a loop (TapLoops._rolled_taps), not unrolled:
unrolled, LLVM hoisted 25 or 49 taps' broadcasts of A and spilled them. A 3x3 window stays
unrolled. With AVX2 the taps stay unrolled (their masks are vectors there, not bits). The
measurements are in docs/measurements.md."""


class ColumnTaps(NamedTuple):
    """A whole tile's tap masks (per tap, per vector), whether all its lanes are on, whether
    every tap's row lies in the input (``_within_plane``) and, for a rolled loop, the
    masks stored to the stack (``_mask_table``)."""

    masks: list[list[ir.Value]]
    inside: ir.Value
    plane: ir.Value
    table: ir.Value | None


class TapRead(NamedTuple):
    """How a tile's tap loop loads B: per tap, per vector, the lanes ``masks`` to read;
    ``select``: plain loads of every lane with the others zeroed (the tap rows lie in the
    input plane, see ``_tap_vector``), else masked loads; ``table``: the rolled loop's
    masks stored already (``ColumnTaps.table``), or None."""

    masks: list[list[ir.Value]]
    select: bool = False
    table: ir.Value | None = None


class TapKernel(Protocol):
    """What the tap loops take from the micro-kernel that calls them (emit/ukernel.py's
    ``_Gemm``): its loop over accumulators, its rank-1 update of a tile's rows, and its
    phis over tiles."""

    def acc_loop(self, acc, start, stop, step, name, body, *, rolled=False): ...

    def fma_rows(self, acc, a_rows, k, bv): ...

    def merge(self, tiles): ...


@dataclass(frozen=True, eq=False)
class TapLoops:
    """The tap loops of the GEMM (emit/ukernel.py's ``_Gemm`` holds one where B is a Conv's
    input read in place): built with ``vectors`` for the contraction ``geo`` under
    ``params``, B's window of ``taps`` a channel, ``reads`` the lowest and highest offset
    from a channel's B row that the domain reads (``tap_span``). How a tile loads its taps
    comes in as a ``TapRead``, the micro-kernel's loops as a ``TapKernel``."""

    vectors: Vectors
    geo: Geometry
    params: Params
    taps: Taps
    reads: tuple[int, int]
    tables: list[ir.GlobalVariable] = field(default_factory=list)
    """The live taps' B offsets and tap numbers as constant arrays, made once a GEMM
    (``_tap_tables``)."""

    def column_taps(self, col: ir.Value) -> ColumnTaps:
        """What the tap loop of a whole tile (first column ``col``) needs, worked out once
        for the column's every row tile (emit/ukernel.py computes it before the row loop)."""
        b = self.vectors.b
        masks = self.tap_masks(
            col, [self.vectors.all_lanes] * (self.params.nr // self.vectors.lanes)
        )
        every = self.vectors.all_lanes
        for t in self.taps.live:  # a dead slot's masks are all off
            for mask in masks[t]:
                every = b.and_(every, mask)
        bits = b.bitcast(every, ir.IntType(self.vectors.lanes))
        inside = b.icmp_unsigned(
            "==", bits, ir.Constant(ir.IntType(self.vectors.lanes), (1 << self.vectors.lanes) - 1)
        )
        rolled = self._rolled()
        table = self._mask_table(masks) if rolled else None
        return ColumnTaps(masks, inside, self._within_plane(col), table)

    def _rolled(self) -> bool:
        """Whether the taps run as a loop, not unrolled (ROLLED_TAPS)."""
        return len(self.taps.live) > ROLLED_TAPS and vector_registers(self.vectors.lanes) >= 32

    def inside_or_edge(self, acc, a_rows, b_at, kcl, column: ColumnTaps, *, kernel: TapKernel):
        """The tap loop three ways: without masks where every tap's window of every column
        of the tile lies inside the image (most tiles of a wide image); with plain loads
        and the tap masks zeroing lanes where every tap's row lies within the input
        (``_within_plane``); else with masked loads. With AVX2's 16 registers the masks
        (taps x NR / W) live on the stack, and a masked load then costs a reload (measured:
        see docs/measurements.md)."""
        b = self.vectors.b
        names = ("inside", "plane", "plane.yes", "edge", "done")
        paths = dict(zip(names, (b.append_basic_block(f"taps.{n}") for n in names), strict=True))
        b.cbranch(column.inside, paths["inside"], paths["plane"])
        b.position_at_end(paths["plane"])
        b.cbranch(column.plane, paths["plane.yes"], paths["edge"])
        results = []
        for path, masks, select in [
            ("inside", None, False),
            ("plane.yes", column.masks, True),
            ("edge", column.masks, False),
        ]:
            b.position_at_end(paths[path])
            read = TapRead(
                masks
                or [
                    [self.vectors.all_lanes] * (self.params.nr // self.vectors.lanes)
                    for _ in column.masks
                ],
                select=select,
                table=None if masks is None else column.table,
            )
            results.append((self.tap_loop(acc, a_rows, b_at, kcl, read, kernel=kernel), b.block))
            b.branch(paths["done"])
        b.position_at_end(paths["done"])
        return kernel.merge(results)

    def _within_plane(self, col: ir.Value) -> ir.Value:
        """Whether every tap's whole NR-wide row of the tile (first column ``col``) lies
        between the lowest and highest element the domain reads (``tap_span``): then loads
        of all lanes stay inside the input (a lane past an image row reads the next row)
        and only need their values masked."""
        b, taps = self.vectors.b, self.taps
        offsets = [taps.offsets[t] for t in taps.live]
        low, high = self.reads
        first = b.add(col, ir.Constant(I64, min(offsets)))
        last = b.add(col, ir.Constant(I64, max(offsets) + self.params.nr - 1))
        return b.and_(
            b.icmp_signed(">=", first, ir.Constant(I64, low)),
            b.icmp_signed("<=", last, ir.Constant(I64, high)),
        )

    def fill_taps(self, src, col, first, rest, kcl, *, bt: ir.Value, kcp: int) -> None:
        """``fill_columns`` for a Conv read in place (``src``: B at this tile's column 0 and
        this K block's first channel, ``col``: the tile's first column): per channel and
        tap, one masked load of the vector at column ``first`` (the window outside the
        image reads 0), its first DOT_COLUMNS lanes stored down the rows of ``bt``."""
        b, taps = self.vectors.b, self.taps
        masks = self.tap_masks(b.add(col, first), [self.vectors.below(ir.Constant(I64, 0), rest)])
        channels = b.udiv(kcl, ir.Constant(I64, taps.count))
        with loop(b, ir.Constant(I64, 0), channels, 1, "btc") as channel:
            row = b.gep(src, [b.mul(channel, ir.Constant(I64, taps.step))], source_etype=F32)
            k0 = b.mul(channel, ir.Constant(I64, taps.count))
            for t, offset in enumerate(taps.offsets):
                at = self.vectors.at(b.gep(row, [first], source_etype=F32), offset)
                value = b.call(
                    self.vectors.mload, [at, ir.Constant(I32, 4), masks[t][0], self.vectors.zero]
                )
                k = b.add(k0, ir.Constant(I64, t))
                for j in range(DOT_COLUMNS):  # rows past ``rest`` get zeros, never read
                    to = b.add(b.mul(ir.Constant(I64, j), ir.Constant(I64, kcp)), k)
                    b.store(b.extract_element(value, i32(j)), self.vectors.at(bt, to), align=4)
        with loop(b, ir.Constant(I64, 0), rest, 1, "btz") as j:
            end = b.add(b.mul(j, ir.Constant(I64, kcp)), kcl)
            b.store(
                self.vectors.zero,
                b.bitcast(self.vectors.at(bt, end), self.vectors.vec.as_pointer()),
                align=4,
            )

    def tap_loop(self, acc, a_rows, b_at, kcl, read: TapRead, *, kernel: TapKernel):
        """The K loop over a Conv's input read in place: a channel a step, its taps
        unrolled (or rolled, ROLLED_TAPS), each tap's B vectors loaded as ``read`` says:
        where its masks say the window is inside the image (and the columns inside the
        tile)."""
        b, taps = self.vectors.b, self.taps
        channels = b.udiv(kcl, ir.Constant(I64, taps.count))
        rolled = self._rolled()
        masks = read.table
        vectors = len(read.masks[0])
        if masks is None and rolled:
            masks = self._mask_table(read.masks)

        def body(cur, channel):
            row = b.gep(b_at, [b.mul(channel, ir.Constant(I64, taps.step))], source_etype=F32)
            if self.params.prefetch:
                self._prefetch_taps(b_at, channel, channels)
            first = b.mul(channel, ir.Constant(I64, taps.count))
            if rolled:
                return self._rolled_taps(
                    cur,
                    a_rows,
                    row,
                    first,
                    masks,
                    select=read.select,
                    vectors=vectors,
                    kernel=kernel,
                )
            for t in taps.live:
                offset = taps.offsets[t]
                bv = [
                    self._tap_vector(row, offset + v * self.vectors.lanes, read, tap=t, v=v)
                    for v in range(vectors)
                ]
                k = b.add(first, ir.Constant(I64, t)) if t else first
                cur = kernel.fma_rows(cur, a_rows, k, bv)
            return cur

        return kernel.acc_loop(acc, ir.Constant(I64, 0), channels, 1, "kch", body)

    def _mask_table(self, tap_masks) -> ir.Value | None:
        """The tile's tap masks (live taps only) stored to a stack array that the rolled
        tap loop reads, an integer of W bits each; None when every mask has all lanes on
        (the tile lies inside the image)."""
        b, taps = self.vectors.b, self.taps
        masks = [tap_masks[t][v] for t in taps.live for v in range(len(tap_masks[t]))]
        if all(isinstance(mask, ir.Constant) for mask in masks):
            return None
        bits = ir.IntType(self.vectors.lanes)
        with b.goto_block(b.function.entry_basic_block):
            table = b.alloca(bits, ir.Constant(I64, len(masks)), "tap.masks")
        for i, mask in enumerate(masks):
            b.store(b.bitcast(mask, bits), b.gep(table, [ir.Constant(I64, i)], source_etype=bits))
        return table

    def _rolled_taps(
        self, acc, a_rows, row, first, masks, *, select: bool, vectors: int, kernel: TapKernel
    ):
        """A channel's live taps as a loop (not unrolled): each step reads its tap's B
        offset and A column from constant tables, and its masks from ``masks`` (with
        ``select``, loads every lane and zeroes the masked ones). Unrolled,
        LLVM schedules a wide window's loads so early that the accumulators spill."""
        b, taps = self.vectors.b, self.taps
        live = len(taps.live)
        kind = ir.ArrayType(I64, live)
        tables = self._tap_tables(kind)
        bits = ir.IntType(self.vectors.lanes)

        def step(cur, i):
            offset, tap = (
                b.load(b.gep(t, [ir.Constant(I64, 0), i], source_etype=kind), typ=I64)
                for t in tables
            )
            bv = []
            for v in range(vectors):
                at = b.gep(
                    row, [b.add(offset, ir.Constant(I64, v * self.vectors.lanes))], source_etype=F32
                )
                if masks is None:
                    bv.append(b.load(at, typ=self.vectors.vec, align=4))
                    continue
                slot = b.add(b.mul(i, ir.Constant(I64, vectors)), ir.Constant(I64, v))
                word = b.load(b.gep(masks, [slot], source_etype=bits), typ=bits)
                mask = b.bitcast(word, self.vectors.mask_t)
                if select:
                    bv.append(
                        b.select(mask, b.load(at, typ=self.vectors.vec, align=4), self.vectors.zero)
                    )
                else:
                    bv.append(
                        b.call(
                            self.vectors.mload, [at, ir.Constant(I32, 4), mask, self.vectors.zero]
                        )
                    )
            return kernel.fma_rows(cur, a_rows, b.add(first, tap), bv)

        stop = ir.Constant(I64, live)
        return kernel.acc_loop(acc, ir.Constant(I64, 0), stop, 1, "tap", step, rolled=True)

    def _tap_tables(self, kind: ir.ArrayType) -> tuple[ir.GlobalVariable, ...]:
        """The live taps' B offsets and tap numbers as constant arrays, made once a GEMM."""
        if not self.tables:
            module, taps = self.vectors.b.module, self.taps
            for values in ([taps.offsets[t] for t in taps.live], list(taps.live)):
                table = ir.GlobalVariable(module, kind, f"taps.{len(module.globals)}")
                table.initializer = ir.Constant(kind, values)
                table.global_constant = True
                table.linkage = "internal"
                self.tables.append(table)
        return tuple(self.tables)

    def _prefetch_taps(self, b_at, channel, channels) -> None:
        """Prefetch into L1 the lines of B this tile reads PREFETCH_CHANNELS channels on
        (the block's last channel where that is past it)."""
        b, last = self.vectors.b, self.vectors.b.sub(channels, ir.Constant(I64, 1))
        later = lesser(b, b.add(channel, ir.Constant(I64, PREFETCH_CHANNELS)), last)
        row = b.gep(b_at, [b.mul(later, ir.Constant(I64, self.taps.step))], source_etype=F32)
        for first, end in tap_lines(self.taps, self.params.nr):
            for offset in [*range(first, end, LINE_FLOATS), end]:
                b.call(
                    self.vectors.prefetch, [self.vectors.at(row, offset), i32(0), i32(3), i32(1)]
                )

    def _tap_vector(self, row, offset: int, read: TapRead, *, tap: int, v: int) -> ir.Value:
        """Vector ``v`` of tap ``tap``'s B row: a masked load, or with ``read.select`` (the
        row lies in the plane) a plain load and its masked lanes zeroed, an AND whose mask
        can stay in memory: with AVX2's 16 registers a masked load needs its mask in one,
        and a 6x16 tile's accumulators then spill."""
        b, mask = self.vectors.b, read.masks[tap][v]
        at = self.vectors.at(row, offset)
        if isinstance(mask, ir.Constant):
            return b.load(at, typ=self.vectors.vec, align=4)
        if read.select:
            return b.select(mask, b.load(at, typ=self.vectors.vec, align=4), self.vectors.zero)
        return b.call(self.vectors.mload, [at, ir.Constant(I32, 4), mask, self.vectors.zero])

    def tap_masks(self, col: ir.Value, masks: list[ir.Value]) -> list[list[ir.Value]]:
        """Per tap, per vector of the tile (first column ``col``): the lanes whose input
        element lies inside the image, and inside the tile (``masks``)."""
        b, geo, taps = self.vectors.b, self.geo, self.taps
        vec32 = ir.VectorType(I32, self.vectors.lanes)
        out = [list(masks) for _ in taps.offsets]
        for v in range(len(masks)):
            first = b.trunc(b.add(col, ir.Constant(I64, v * self.vectors.lanes)), I32)
            flat = b.add(splat(b, first, self.vectors.lanes), self.vectors.lane_ids)
            values = {}
            for d in reversed(geo.cols):
                size = ir.Constant(vec32, [geo.sizes[d]] * self.vectors.lanes)
                values[d] = b.urem(flat, size)
                flat = b.udiv(flat, size)
            for columns, bounds in zip(taps.columns, taps.bounds, strict=True):
                part = ir.Constant(vec32, [0] * self.vectors.lanes)
                for d, coeff in zip(geo.cols, columns, strict=True):
                    if coeff:
                        part = b.add(
                            part, b.mul(values[d], ir.Constant(vec32, [coeff] * self.vectors.lanes))
                        )
                for t, bound in enumerate(bounds):
                    inside = b.icmp_signed(
                        ">=", part, ir.Constant(vec32, [-bound] * self.vectors.lanes)
                    )
                    out[t][v] = b.and_(out[t][v], inside)
        return out
