"""The GEMM view of a contraction, which the ``ukernel`` schedule (schedule/heuristics/ukernel.py)
runs as packed, cache-tiled, register-blocked GEMM (emitted by emit/ukernel.py).

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

Schedule (schedule/heuristics/ukernel.py): the statement's loops become ``outer.. / m / n.. / k..``
with a ``ukernel`` mark above ``m``; the mark carries the parameters (MR, NR, KC, MC, NC,
K-unroll, and how the GEMM is split over threads). The reduction keeps its order: each C
element is loaded into its accumulator, gets its products added in the original k order,
and is stored back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

import islpy as isl

from polyonnx.krnl.ir import Binary, Buffer, Load, Statement
from polyonnx.krnl.islutil import dim_names, extents, parse_access, parse_set, row_major_strides
from polyonnx.schedule.state import UKERNEL

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


@dataclass(frozen=True)
class FittedGemm:
    """The GEMM view of a parametric kernel's contraction ``statement``, fitted from the
    kernel lowered at sample sizes (krnl/params.py): rows and outer dims' sizes and strides
    may be polynomials in the parameters. ``operands``: its epilogue's loads, as
    emit/ukernel.py's ``Gemm.operands`` gives them."""

    statement: str
    geo: Geometry
    operands: tuple = ()


def is_ukernel_mark(name: str) -> bool:
    return name.startswith(UKERNEL + "_")


def geometry(
    stmt: Statement, buffers: Mapping[str, Buffer], row: int | None = None
) -> Geometry | None:
    """The GEMM view of ``stmt`` (module docstring), or None when it is not one; with
    ``row``, the view whose row dim is that one (None if it cannot be a row)."""
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
    c = affine(stmt.write.buffer, stmt.write.index, buffers)
    ops = [affine(x.access.buffer, x.access.index, buffers) for x in loads]
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
    if row is not None and row not in rows:
        return None
    row = max(rows, key=lambda d: sizes[d]) if row is None else row
    unit = [d for d in range(len(names)) if sizes[d] == 1]
    outer = tuple(d for d in range(len(names)) if d != row and d not in cols and d not in depth)
    constraints = _constraints(domain, len(names), set(cols) | set(depth), set(unit))
    if constraints is None:
        return None
    return Geometry(names, sizes, row, cols, depth, outer, a, b, c, constraints)


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


def affine(buffer: str, index: str, buffers: Mapping[str, Buffer]) -> Affine | None:
    maff = parse_access(index)
    if any(not integral(maff.get_aff(r)) for r in range(maff.dim(isl.dim_type.out))):
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


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def column_step(coeffs, geo: Geometry) -> int | None:
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


def integral(aff: isl.Aff) -> bool:
    """Integer coefficients and constant (no ``i/2``)."""
    return aff.get_denominator_val().is_one()
