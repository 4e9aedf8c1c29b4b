"""Symbolic dims as isl parameters: a Program whose domains and access maps read
``[S] -> { ... }`` and whose buffer dims are polynomials in the parameters.

Lowerings are written for concrete shapes. So the parametric program is found from
lowerings at a few sizes: every integer of every isl string, buffer dim and view offset is
fitted as an affine function of the parameters, and checked at one more size. Everything
else must agree exactly. Where it does not (a constant or a message that depends on a
size, a different kernel structure), the model is not parametric and compiles per shape.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from polyonnx.errors import PolyonnxError
from polyonnx.krnl.ir import Buffer, Program

Point = Mapping[str, int]
Monomial = tuple[tuple[str, int], ...]


class NotParametric(PolyonnxError):
    """The lowerings at several sizes do not make one parametric program: why."""


@dataclass(frozen=True)
class Poly:
    """An integer polynomial in the parameters: ``terms`` maps monomials (sorted (name,
    power) pairs; () is the constant) to nonzero coefficients."""

    terms: tuple[tuple[Monomial, int], ...]

    @staticmethod
    def of(value: int | Poly) -> Poly:
        if isinstance(value, Poly):
            return value
        return Poly((((), int(value)),)) if value else Poly(())

    @staticmethod
    def symbol(name: str) -> Poly:
        return Poly(((((name, 1),), 1),))

    def __add__(self, other: int | Poly) -> Poly:
        total = dict(self.terms)
        for mono, coeff in Poly.of(other).terms:
            total[mono] = total.get(mono, 0) + coeff
        return _poly(total)

    __radd__ = __add__

    def __mul__(self, other: int | Poly) -> Poly:
        total: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in Poly.of(other).terms:
                mono = _times(m1, m2)
                total[mono] = total.get(mono, 0) + c1 * c2
        return _poly(total)

    __rmul__ = __mul__

    def at(self, point: Point) -> int:
        total = 0
        for mono, coeff in self.terms:
            for name, power in mono:
                coeff *= point[name] ** power
            total += coeff
        return total

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(name for mono, _ in self.terms for name, _ in mono)

    @property
    def isl_names(self) -> frozenset[str]:
        """The isl parameters :meth:`isl` names."""
        return frozenset(_isl_name(mono) for mono, _ in self.terms if mono)

    @property
    def constant(self) -> int | None:
        """The value when it does not depend on a parameter, else None."""
        if not self.symbols:
            return dict(self.terms).get((), 0)
        return None

    def isl(self) -> str:
        """The polynomial as isl reads it (affine ones only: isl has no products)."""
        parts = []
        for mono, coeff in self.terms:
            if not mono:
                parts.append(str(coeff))
            elif sum(power for _, power in mono) <= 2:
                parts.append(f"{coeff}*{_isl_name(mono)}")
            else:
                raise NotParametric(f"{self} is not affine; isl cannot hold it")
        return "(" + " + ".join(parts or ["0"]) + ")"

    def __str__(self) -> str:
        parts = []
        for mono, coeff in self.terms:
            names = "*".join(n if p == 1 else f"{n}^{p}" for n, p in mono)
            parts.append(str(coeff) if not names else names if coeff == 1 else f"{coeff}*{names}")
        return " + ".join(parts) or "0"


def _isl_name(mono: Monomial) -> str:
    """The isl parameter of a monomial of degree 1 or 2: ``S``, ``N_x_S``, ``S_x_S``."""
    return TIMES.join(name for name, power in mono for _ in range(power))


def _times(m1: Monomial, m2: Monomial) -> Monomial:
    powers = dict(m1)
    for name, power in m2:
        powers[name] = powers.get(name, 0) + power
    return tuple(sorted(powers.items()))


def _poly(total: Mapping[Monomial, int]) -> Poly:
    return Poly(tuple(sorted((m, c) for m, c in total.items() if c)))


Dim = int | Poly


def value_at(dim: Dim, point: Point) -> int:
    return dim.at(point) if isinstance(dim, Poly) else int(dim)


def shape_at(shape: Sequence[Dim], point: Point) -> tuple[int, ...]:
    return tuple(value_at(d, point) for d in shape)


def program_symbols(program: Program) -> tuple[str, ...]:
    found = {s for b in program.buffers.values() for d in b.shape if isinstance(d, Poly)
             for s in d.symbols}  # fmt: skip
    return tuple(sorted(found))


def strides(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """Row-major element strides (a dim of 0 counts as 1, as in islutil's)."""
    out: list[Dim] = []
    step: Dim = 1
    for n in reversed(shape):
        out.append(step)
        step = step * (n if isinstance(n, Poly) else max(int(n), 1))
    return tuple(_plain(s) for s in reversed(out))


def _plain(dim: Dim) -> Dim:
    if isinstance(dim, Poly) and dim.constant is not None:
        return dim.constant
    return dim


# ---- sample points ---------------------------------------------------------------

BASE = 5
STEPS = (7, 11)
CHECKS = (61, 127)
"""The sizes lowered: every symbol at BASE, then each symbol in turn at STEPS (the fit),
then all at each of CHECKS (the test of the fit, and where schedules are chosen:
schedule/heuristics/parametric.py). Primes from 5: no size is 1 (where lowerings
special-case broadcasting) and none divides another's tiles."""


def parameters(symbols: Sequence[str]) -> tuple[str, ...]:
    """The isl parameters of a program over ``symbols``: each symbol, then each product
    of two, squares too (``batch_x_seq``: isl is affine, so a flattened batch x sequence
    dim is a parameter of its own, whose value the runtime computes)."""
    pairs = [TIMES.join(sorted((a, b))) for i, a in enumerate(symbols) for b in symbols[i:]]
    return (*symbols, *pairs)


TIMES = "_x_"


def parameter_value(name: str, point: Point) -> int:
    """The value of isl parameter ``name`` (a symbol or a product) at ``point``."""
    value = 1
    for symbol in name.split(TIMES):
        value *= point[symbol]
    return value


def _monomials(symbols: Sequence[str]) -> list[Monomial]:
    """1, each symbol, and each product of two (squares too: S x S score matrices)."""
    pairs = [_times(((a, 1),), ((b, 1),)) for i, a in enumerate(symbols) for b in symbols[i:]]
    return [(), *(((s, 1),) for s in symbols), *pairs]


def _monomial_at(mono: Monomial, point: Point) -> int:
    value = 1
    for name, power in mono:
        value *= point[name] ** power
    return value


def sample_points(symbols: Sequence[str]) -> list[dict[str, int]]:
    base = dict.fromkeys(symbols, BASE)
    points = [base]
    for s in symbols:
        points += [{**base, s: step} for step in STEPS]
    return points + [dict.fromkeys(symbols, size) for size in CHECKS]


def parametric_program(
    symbols: Sequence[str], lower_at: Callable[[Mapping[str, int]], Program]
) -> Program:
    """The program of ``lower_at(point)`` with each of ``symbols`` an isl parameter;
    raises NotParametric (and whatever lowering raises) where there is none."""
    points = sample_points(symbols)
    programs = [lower_at(p) for p in points]
    fit = Fit(tuple(symbols), points)
    return fit.program(programs)


@dataclass(frozen=True)
class Fit:
    """Unifies what was made at each of ``points`` (sample_points' order) into one value
    over the symbols."""

    symbols: tuple[str, ...]
    points: list[dict[str, int]]

    def number(self, values: Sequence[int], where: str) -> Dim:
        """The function of the symbols, affine but for products of two symbols, that
        takes ``values`` at the points (found at the fit points, checked at all)."""
        monomials = _monomials(self.symbols)
        rows = [[_monomial_at(m, p) for m in monomials] for p in self.points]
        solved, *_ = np.linalg.lstsq(np.array(rows, float), np.array(values, float), rcond=None)
        coeffs = [int(np.rint(c)) for c in solved]
        poly = _poly(dict(zip(monomials, coeffs, strict=True)))
        if any(poly.at(p) != v for p, v in zip(self.points, values, strict=True)):
            raise NotParametric(f"{where}: {list(values)} is not affine in {self.symbols}")
        return _plain(poly)

    def text(self, texts: Sequence[str], where: str) -> str:
        """An isl string with every size-dependent integer as a function of the symbols."""
        pieces = [NUMBER.split(t) for t in texts]
        if any(len(p) != len(pieces[0]) for p in pieces) or any(
            p[i] != pieces[0][i] for p in pieces for i in range(0, len(p), 2)
        ):
            raise NotParametric(f"{where}: {texts[0]!r} changes form with the sizes")
        out = list(pieces[0])
        for i in range(1, len(out), 2):
            dim = self.number([int(p[i]) for p in pieces], where)
            if isinstance(dim, Poly):
                if out[i - 1].rstrip().endswith(("/", "*")) or pieces[0][i + 1].lstrip()[:1] in (
                    "*",
                    "/",
                ):
                    raise NotParametric(f"{where}: a size multiplies or divides in {texts[0]!r}")
                out[i] = dim.isl()
        params = ", ".join(parameters(self.symbols))
        return f"[{params}] -> " + "".join(out)

    def same(self, values: Sequence[object], where: str) -> object:
        first = values[0]
        for other in values[1:]:
            if isinstance(first, np.ndarray):
                equal = (
                    isinstance(other, np.ndarray)
                    and other.dtype == first.dtype
                    and other.shape == first.shape
                    and other.tobytes() == first.tobytes()
                )
            else:
                equal = type(other) is type(first) and other == first
            if not equal:
                raise NotParametric(f"{where} depends on the sizes")
        return first

    def tree(self, values: Sequence[object], where: str, numbers: bool = False) -> object:
        """Frozen dataclasses, tuples and plain values, unified field by field: domains
        and access maps (the fields ``domain`` and ``index``) fitted, with ``numbers`` the
        ints too, the rest equal."""
        first = values[0]
        if numbers and isinstance(first, int) and not isinstance(first, bool):
            if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
                raise NotParametric(f"{where} changes form with the sizes")
            return self.number(values, where)
        if any(type(v) is not type(first) for v in values):
            raise NotParametric(f"{where} changes form with the sizes")
        if dataclasses.is_dataclass(first) and not isinstance(first, type):
            fields = {}
            for f in dataclasses.fields(first):
                items = [getattr(v, f.name) for v in values]
                if f.name in ("domain", "index") and isinstance(items[0], str):
                    fields[f.name] = self.text(items, f"{where}.{f.name}")
                else:
                    fields[f.name] = self.tree(items, f"{where}.{f.name}", numbers)
            return dataclasses.replace(first, **fields)
        if isinstance(first, tuple):
            if any(len(v) != len(first) for v in values):
                raise NotParametric(f"{where} changes length with the sizes")
            return tuple(
                self.tree(items, f"{where}[{i}]", numbers)
                for i, items in enumerate(zip(*values, strict=True))
            )
        return self.same(values, where)

    def buffer(self, buffers: Sequence[Buffer]) -> Buffer:
        first = buffers[0]
        where = f"buffer {first.name!r}"
        self.same([b.dtype for b in buffers], f"{where}'s dtype")
        if any(len(b.shape) != len(first.shape) for b in buffers):
            raise NotParametric(f"{where} changes rank with the sizes")
        shape = tuple(
            self.number([b.shape[r] for b in buffers], f"{where}'s dim {r}")
            for r in range(len(first.shape))
        )
        return Buffer(first.name, shape, first.dtype)

    def program(self, programs: Sequence[Program], derived: set[str] | None = None) -> Program:
        """The programs unified. A constant that depends on the sizes (a causal mask
        folded from the sequence length) is refused, or with ``derived`` added to it:
        its values are then the caller's to supply per size (its buffer's dims fitted)."""
        first = programs[0]
        for name in ("inputs", "outputs"):
            self.same([getattr(p, name) for p in programs], f"the program's {name}")
        for name in ("buffers", "constants", "views", "slices"):
            self.same([tuple(getattr(p, name)) for p in programs], f"the names of its {name}")
        if any(p.input_offsets for p in programs):
            raise NotParametric("its code is laid out for where an input starts")
        constants = {}
        for n in first.constants:
            values = [p.constants[n] for p in programs]
            try:
                constants[n] = self.same(values, f"constant {n!r}")
            except NotParametric:
                if derived is None or len({v.dtype for v in values}) != 1:
                    raise
                derived.add(n)
                constants[n] = values[-1]
        slices = {
            n: self.same([p.slices[n] for p in programs], f"where part {n!r} starts")
            for n in first.slices
        }
        views = {n: self.same([p.views[n] for p in programs], f"view {n!r}") for n in first.views}
        buffers = {n: self.buffer([p.buffers[n] for p in programs]) for n in first.buffers}
        if any(len(p.kernels) != len(first.kernels) for p in programs):
            raise NotParametric("its kernels change in number with the sizes")
        kernels = tuple(
            self.tree([p.kernels[i] for p in programs], f"kernel {k.name!r} ({k.op_type})")
            for i, k in enumerate(first.kernels)
        )
        return dataclasses.replace(
            first,
            kernels=kernels,
            buffers=MappingProxyType(buffers),
            constants=MappingProxyType(constants),
            views=MappingProxyType(views),
            slices=MappingProxyType(slices),
        )


NUMBER = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
"""An integer in an isl string that is not part of a name (S0, i1) or a decimal."""
