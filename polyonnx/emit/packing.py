"""Packing for the GEMM micro-kernel (emit/ukernel.py's ``_Gemm``): A's MC x KC block into
MR-interleaved panels, and B's KC x NC block into NR-wide micro-panels (an im2col block of
a Conv's input, copied a run of a row at a time: contiguous, every other element of a
stride-2 row, or gathered), zero where the domain has no point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from polyonnx.emit.irhelp import (
    F32,
    I32,
    Vectors,
    at_least,
    dot,
    floor_div,
    greater,
    i32,
    lesser,
    loop,
    round_up,
    transpose,
    unflatten,
)
from polyonnx.emit.llvmtypes import I64, PTR, splat
from polyonnx.krnl.params import Dim
from polyonnx.schedule.gemm import Geometry, Params

PACK_PREFETCH_ROWS = 3
"""Packing B read row by row prefetches the row this many on (see _prefetch_b_row). Since
the first row tile packs such a B (``fuse_packing``), the packing pass reads it only where
the last columns are dot products. The measurements are in docs/measurements.md."""


@dataclass(frozen=True, eq=False)
class Packing:
    """The packing loops of the GEMM (emit/ukernel.py's ``_Gemm`` holds one): A's and B's
    blocks into packed panels, built with ``vectors`` for the contraction ``geo`` under
    ``params``; ``ldb``: B's row stride where B is read a row at a time, else 0."""

    vectors: Vectors
    geo: Geometry
    params: Params
    ldb: Dim
    value: Callable[[Dim], ir.Value]
    """A size or stride as an i64 (a parametric GEMM's may be run-time values)."""

    def pack_a(self, panel, src, ic, ie, kc, kcl) -> None:
        """Rows ic..ie, columns kc..kc+kcl of A into ``panel``: per MR rows, k-major with
        the MR values of one k side by side (rows past ie repeat the last row). W columns
        at a time: a vector from each row, transposed in registers; the last kcl % W
        columns one value at a time."""
        b, p = self.vectors.b, self.params
        last = b.sub(ie, ir.Constant(I64, 1))
        whole = b.sub(kcl, b.urem(kcl, ir.Constant(I64, self.vectors.lanes)))
        block_t = ir.VectorType(F32, p.mr * self.vectors.lanes)
        with loop(b, ic, ie, p.mr, "pa") as start:
            block = b.sdiv(b.sub(start, ic), ir.Constant(I64, p.mr))
            dst = b.gep(panel, [b.mul(block, b.mul(kcl, ir.Constant(I64, p.mr)))], source_etype=F32)
            origins = []
            for r in range(p.mr):
                row = lesser(b, b.add(start, ir.Constant(I64, r)), last)
                at = b.add(b.mul(row, self.value(self.geo.lda)), kc)
                origins.append(b.gep(src, [at], source_etype=F32))
            with loop(b, ir.Constant(I64, 0), whole, self.vectors.lanes, "pav") as k:
                rows = [
                    b.load(self.vectors.at(o, k), typ=self.vectors.vec, align=4) for o in origins
                ]
                at = self.vectors.at(dst, b.mul(k, ir.Constant(I64, p.mr)))
                out = b.bitcast(at, block_t.as_pointer())
                b.store(transpose(b, rows, self.vectors.lanes), out, align=4)
            for r, origin in enumerate(origins):
                with loop(b, whole, kcl, 1, f"pa{r}") as k:
                    value = b.load(self.vectors.at(origin, k), typ=F32, align=4)
                    at = b.add(b.mul(k, ir.Constant(I64, p.mr)), ir.Constant(I64, r))
                    b.store(value, self.vectors.at(dst, at), align=4)

    def pack_b(self, panel, src, kc, kcl, jc, nc) -> None:
        """Rows kc..kc+kcl, columns jc..jc+nc of B into ``panel`` (micro-panel order, see
        ``ncp``), zero where the domain has no point, then zeros up to the next whole NR
        tile."""
        b, geo, nr = self.vectors.b, self.geo, self.params.nr
        width = self.value(math.prod(geo.sizes[d] for d in self.run_dims))
        with loop(b, ir.Constant(I64, 0), kcl, 1, "pk") as kk:
            values = unflatten(b, b.add(kc, kk), [(d, geo.sizes[d]) for d in geo.depth])
            row_off = self._dot(geo.b.coeffs, values)
            rests = [dot(b, coeffs, values, const) for coeffs, const in geo.constraints]
            first = b.sdiv(jc, width)
            last = b.sdiv(b.add(jc, b.sub(nc, ir.Constant(I64, 1))), width)
            with loop(b, first, b.add(last, ir.Constant(I64, 1)), 1, "pr") as rho:
                self._pack_run(
                    src, panel, row=kk, rho=rho, jc=jc, nc=nc, row_off=row_off, rests=rests
                )
            partial = b.urem(nc, ir.Constant(I64, nr))
            tail = b.sub(round_up(b, nc, nr), nc)
            row = self._panel_at(panel, kk, b.sub(nc, partial), partial)
            # not with no columns to zero: a masked store whose lanes are all off still
            # costs a microcode assist where its page was never touched (the panel's
            # spare micro-panel on a worker's fresh stack)
            with b.if_then(b.icmp_signed(">", partial, ir.Constant(I64, 0))):
                for v in range(nr // self.vectors.lanes):
                    mask = self.vectors.below(ir.Constant(I64, v * self.vectors.lanes), tail)
                    at = self.vectors.at(row, v * self.vectors.lanes)
                    b.call(self.vectors.mstore, [self.vectors.zero, at, i32(4), mask])

    def _dot(self, coeffs, values: dict[int, ir.Value], start: ir.Value | None = None):
        """``start + sum(coeffs[d] * values[d])``, coefficients possibly run-time values."""
        b = self.vectors.b
        total = start if start is not None else ir.Constant(I64, 0)
        for d, value in values.items():
            if coeffs[d]:
                total = b.add(total, b.mul(value, self.value(coeffs[d])))
        return total

    def fuse_packing(self, *, dot_columns: bool) -> bool:
        """Whether the first row tile of a block packs B as it computes: it reads B in
        place a row at a time (``ldb``) and stores each vector it loads to the panel,
        where its FMAs hide the copy, and the other row tiles read the panel. Not with
        the last columns as dot products (``dot_columns``: their transposed copy comes
        from the panel)."""
        return bool(self.ldb) and not dot_columns

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
        b = self.vectors.b
        return b.gep(panel, [b.mul(col, ir.Constant(I64, self.params.kc))], source_etype=F32)

    def _panel_at(self, panel, k, tile_col, offset) -> ir.Value:
        """The packed panel at row ``k``, column ``tile_col + offset`` (``tile_col`` a
        multiple of NR, ``offset`` below NR)."""
        b = self.vectors.b
        row = b.add(b.mul(k, ir.Constant(I64, self.params.nr)), offset)
        return b.gep(self.panel_tile(panel, tile_col), [row], source_etype=F32)

    def _pack_run(self, src, panel, *, row, rho, jc, nc, row_off, rests) -> None:
        """One run of the innermost J dim (fixed outer J dims ``rho``), clipped to the
        column block (``jc``, ``nc`` columns) and to the domain's constraints (``rests``:
        their values at this row), into ``row`` of the panel (``row_off``: B's offset of
        that row)."""
        b, geo, kk = self.vectors.b, self.geo, row
        inner = geo.cols[-1]
        runs = self.run_dims
        width = self.value(math.prod(geo.sizes[d] for d in runs))
        base = b.mul(rho, width)
        w0 = at_least(b, b.sub(jc, base), 0)
        w1 = lesser(b, b.sub(b.add(jc, nc), base), width)
        values = unflatten(b, rho, [(d, geo.sizes[d]) for d in geo.cols[: -len(runs)]])
        offset = self._dot(geo.b.coeffs, values, start=row_off)
        lo, hi = w0, w1
        for (coeffs, _), rest in zip(geo.constraints, rests, strict=True):
            rest = dot(b, coeffs, values, 0, start=rest)
            lo, hi = self._clip(coeffs[inner], rest, lo, hi, w1)
        step = geo.b.coeffs[inner]
        with loop(b, w0, w1, self.vectors.lanes, "pw") as w:
            at = b.sub(b.add(base, w), jc)  # the panel column
            whole = b.icmp_signed("<=", b.add(w, ir.Constant(I64, self.vectors.lanes)), hi)
            inside = b.and_(b.icmp_signed(">=", w, lo), whole)
            with b.if_else(inside, likely=True) as (then, otherwise):
                with then:  # a whole vector of taps inside the image: no masks
                    if step == 1 and self.ldb:
                        self._prefetch_b_row(src, offset, w)
                    value = self._run_vector(src, offset, w, step, self.vectors.all_lanes)
                    self._panel_store(panel, kk, at, value, self.vectors.all_lanes)
                with otherwise:  # a run's ends: the padding and the block's edge
                    keep = self.vectors.below(w, w1)
                    valid = b.and_(
                        keep, b.and_(self.vectors.below(w, hi), b.not_(self.vectors.below(w, lo)))
                    )
                    value = self._run_vector(src, offset, w, step, valid)
                    self._panel_store(panel, kk, at, value, keep)

    def _prefetch_b_row(self, src, offset, w) -> None:
        """Prefetch into L1 the line of B that packing copies PACK_PREFETCH_ROWS rows on
        (each B row a packed block reads is a short run in another page, whose first lines
        the hardware prefetchers miss; a prefetch past B's end does not fault)."""
        b = self.vectors.b
        at = b.gep(src, [b.add(offset, w)], source_etype=F32)
        later = b.gep(at, [b.mul(ir.Constant(I64, PACK_PREFETCH_ROWS), self.value(self.ldb))],
                      source_etype=F32)  # fmt: skip
        b.call(self.vectors.prefetch, [later, i32(0), i32(3), i32(1)])

    def _panel_store(self, panel, k, col, value, mask) -> None:
        """Store the lanes of ``value`` under ``mask`` at row ``k``, columns ``col ..`` of
        the packed panel: one store, or two where the vector crosses into the next
        micro-panel (a Conv's output row that does not start on a vector)."""
        b, nr = self.vectors.b, self.params.nr
        offset = b.urem(col, ir.Constant(I64, nr))
        at = self._panel_at(panel, k, b.sub(col, offset), offset)
        fits = b.icmp_unsigned("<=", offset, ir.Constant(I64, nr - self.vectors.lanes))
        with b.if_else(fits, likely=True) as (then, otherwise):
            with then:
                b.call(self.vectors.mstore, [value, at, i32(4), mask])
            with otherwise:
                here = self.vectors.below(offset, ir.Constant(I64, nr))
                b.call(self.vectors.mstore, [value, at, i32(4), b.and_(mask, here)])
                # lane l >= NR - offset is column l - (NR - offset) of the next micro-panel
                there = self.vectors.at(at, (self.params.kc - 1) * nr)
                spill = b.and_(mask, b.not_(here))
                bits = b.bitcast(spill, ir.IntType(self.vectors.lanes))
                with b.if_then(
                    b.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(self.vectors.lanes), 0))
                ):
                    b.call(self.vectors.mstore, [value, there, i32(4), spill])  # see pack_b

    def _run_vector(self, src, offset, w, step: int, mask) -> ir.Value:
        """Lanes l of ``src[offset + step*(w + l)]`` where ``mask``, else 0."""
        if step == 1:
            b, vectors = self.vectors.b, self.vectors
            at = b.gep(src, [b.add(offset, w)], source_etype=F32)
            return b.call(vectors.mload, [at, ir.Constant(I32, 4), mask, vectors.zero])
        if step == 2:
            return self._every_other(src, offset, w, mask)
        return self._gather(src, offset, w, step, mask)

    def _clip(self, a: int, rest, lo, hi, w1):
        """Narrow [lo, hi) to the w with ``a*w + rest >= 0``."""
        b = self.vectors.b
        if a > 0:  # w >= ceil(-rest / a)
            return greater(b, lo, b.sub(ir.Constant(I64, 0), floor_div(b, rest, a))), hi
        if a < 0:  # w <= floor(rest / -a)
            return lo, lesser(b, hi, b.add(floor_div(b, rest, -a), ir.Constant(I64, 1)))
        empty = b.icmp_signed("<", rest, ir.Constant(I64, 0))
        return b.select(empty, w1, lo), hi

    def _every_other(self, src, offset, w, mask) -> ir.Value:
        """Lanes l of ``src[offset + 2*(w + l)]`` (a stride-2 conv's row): two contiguous
        masked loads and one shuffle of their even lanes, instead of a gather."""
        b, lanes = self.vectors.b, self.vectors.lanes
        start = b.gep(src, [b.add(offset, b.mul(w, ir.Constant(I64, 2)))], source_etype=F32)
        none = ir.Constant(self.vectors.mask_t, [0] * lanes)
        halves = []
        for half in range(2):
            # source lane 2i is destination lane half*lanes/2 + i; odd source lanes unused
            picks = [half * lanes // 2 + i // 2 if i % 2 == 0 else lanes for i in range(lanes)]
            part = b.shuffle_vector(mask, none, ir.Constant(ir.VectorType(I32, lanes), picks))
            at = self.vectors.at(start, half * lanes)
            halves.append(
                b.call(self.vectors.mload, [at, ir.Constant(I32, 4), part, self.vectors.zero])
            )
        evens = ir.Constant(ir.VectorType(I32, lanes), list(range(0, 2 * lanes, 2)))
        return b.shuffle_vector(halves[0], halves[1], evens)

    def _gather(self, src, offset, w, step, mask) -> ir.Value:
        b = self.vectors.b
        vec64 = ir.VectorType(I64, self.vectors.lanes)
        start = b.ptrtoint(
            b.gep(src, [b.add(offset, b.mul(w, ir.Constant(I64, step)))], source_etype=F32), I64
        )
        lanes = ir.Constant(vec64, [4 * step * lane for lane in range(self.vectors.lanes)])
        ptrs = b.inttoptr(
            b.add(splat(b, start, self.vectors.lanes), lanes),
            ir.VectorType(PTR, self.vectors.lanes),
        )
        return b.call(self.vectors.gather, [ptrs, ir.Constant(I32, 4), mask, self.vectors.zero])
