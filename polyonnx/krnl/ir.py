"""The krnl IR: buffers, isl domains and access maps, scalar expression trees.

Everything here is a frozen dataclass of plain data. isl objects are kept as their isl
strings (``{ S0[i, j] : 0 <= i < 8 and 0 <= j < 4 }``), so a Program pickles for tuning
workers and prints for humans; :mod:`polyonnx.krnl.isl` parses them on demand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import ml_dtypes  # noqa: F401  (registers bfloat16, float8_*, int4… as numpy dtypes)
import numpy as np

SMALL_FLOAT_DTYPES = frozenset(
    {
        "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
        "float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn",
    }
)  # fmt: skip
SMALL_INT_DTYPES = frozenset({"int4", "uint4", "int2", "uint2"})
FLOAT_DTYPES = frozenset({"float16", "float32", "float64"}) | SMALL_FLOAT_DTYPES
INT_DTYPES = (
    frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
    | SMALL_INT_DTYPES
)
DTYPES = FLOAT_DTYPES | INT_DTYPES | {"bool"}
"""Storage types. bfloat16, float8, float4/6 and 2/4-bit ints are stored as they are and
computed in float32 (int8/uint8 for the small ints): loads decode, stores encode."""


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_unsigned(dtype: str) -> bool:
    return dtype.startswith("uint") or dtype == "bool"


def register_dtype(dtype: str) -> str:
    """The dtype a value of ``dtype`` has while it is being computed on."""
    if dtype in SMALL_FLOAT_DTYPES:
        return "float32"
    if dtype in SMALL_INT_DTYPES:
        return "uint8" if dtype.startswith("u") else "int8"
    return dtype


@dataclass(frozen=True)
class Buffer:
    """A dense row-major tensor. ``shape`` is static: sessions specialise symbolic dims."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize


@dataclass(frozen=True)
class Access:
    """A read or write of ``buffer`` at ``index``: an isl multi-affine map, as a string,
    from the statement's domain to the buffer's index space, e.g.
    ``{ S0[i, j, k] -> [i, k] }``. Broadcasting and transposes are just maps."""

    buffer: str
    index: str


# ---- scalar expressions -----------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    dtype: str


@dataclass(frozen=True)
class Load(Expr):
    access: Access


@dataclass(frozen=True)
class LoadAt(Expr):
    """A read at computed indices: one int64 expression per buffer dim (Iter, a Load of an
    index tensor, arithmetic). For data-dependent reads (Gather, Resize); each index is
    clamped into the buffer, so a bad index can never read out of bounds. Lowerings wrap
    negative indices themselves where ONNX says so, and wrap an index a user gives in a
    :class:`Checked`, so that one out of range is an error, not a clamped read."""

    buffer: str
    index: tuple[Expr, ...]


@dataclass(frozen=True)
class CheckSite:
    """Where a run-time check stands and what its failure says: ``message`` with
    ``{value}`` where the offending value goes. Its ``id`` is what native code records."""

    node: str
    op: str
    message: str

    @property
    def id(self) -> int:
        """A stable, nonzero 63-bit number for the site (a hash of what it says): kernels
        are emitted in worker processes, so no counter could number them."""
        digest = hashlib.sha1(repr((self.node, self.op, self.message)).encode()).digest()
        return (int.from_bytes(digest[:8], "little") & (2**63 - 1)) | 1

    def text(self) -> str:
        """The error message, ``{value}`` still in it."""
        return f"node {self.node!r} ({self.op}): {self.message}"


@dataclass(frozen=True)
class Checked(Expr):
    """The value of ``x``, where the bool ``ok`` must hold at run time: where it does not,
    native code records ``site`` and x's value (as int64) and the run raises RunError
    (the first failure of a run wins). Lowerings wrap the index tensors and integer
    divisors a user gives; what follows stays memory-safe without it (LoadAt clamps,
    integer division never traps)."""

    x: Expr
    ok: Expr
    site: CheckSite


@dataclass(frozen=True)
class Const(Expr):
    value: float | int | bool


@dataclass(frozen=True)
class Extent(Expr):
    """The size of dim ``axis`` of ``buffer`` (an int64): a number in code for one shape,
    a run-time value where the dim is a symbolic one (krnl/params.py). Lowerings that
    wrap or check an index against a dim of data whose shape may be symbolic use it, so
    that their expressions are the same at every size."""

    buffer: str
    axis: int


@dataclass(frozen=True)
class Iter(Expr):
    """The value of one domain dimension of the statement (an int64)."""

    dim: str


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    x: Expr


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Cast(Expr):
    x: Expr
    saturate: bool = True
    """For casts to float8: clamp out-of-range values to the largest finite one (ONNX
    Cast's default) rather than giving inf/NaN."""


UNARY_OPS = frozenset(
    {
        "neg", "abs", "sqrt", "exp", "log", "tanh", "sigmoid", "erf", "sin", "cos",
        "floor", "ceil", "round", "sign", "reciprocal", "not", "softplus", "expm1", "log1p",
        "expneg", "isnan", "isinf", "isposinf", "isneginf",
    }
)  # fmt: skip
BINARY_OPS = frozenset(
    {
        "add", "sub", "mul", "div", "mod", "fmod", "pow", "max", "min",
        "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor",
        "shl", "shr", "bitand", "bitor", "bitxor",
    }
)  # fmt: skip
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
REDUCE_OPS = frozenset({"add", "mul", "max", "min", "max_nnan"})
"""``max_nnan`` is a float max that may give either operand when one is NaN (one vmaxps;
``max`` propagates NaN, which costs three more instructions per step). For a reduction
whose NaN inputs reach the result by another path, as Softmax's do through its sum."""


def reduce_identity(op: str, dtype: str) -> float | int | bool:
    """The neutral element of reduction operator ``op`` in ``dtype``."""
    if op == "add":
        return False if dtype == "bool" else 0
    if op == "mul":
        return True if dtype == "bool" else 1
    if dtype == "bool":
        return op == "min"
    low = op in ("max", "max_nnan")
    if is_float(dtype):
        return -np.inf if low else np.inf
    info = np.iinfo(np.dtype(register_dtype(dtype)))
    return int(info.min if low else info.max)


def loads(expr: Expr) -> list[Load]:
    """Every Load in ``expr``, left to right."""
    if isinstance(expr, Load):
        return [expr]
    found: list[Load] = []
    for child in children(expr):
        found.extend(loads(child))
    return found


def map_expr(expr: Expr, fn) -> Expr:
    """``expr`` rebuilt bottom-up: children first, then ``fn`` on each (rebuilt) node; what
    ``fn`` returns is not visited again."""
    kids = children(expr)
    if kids:
        if isinstance(expr, LoadAt):
            expr = dataclasses.replace(expr, index=tuple(map_expr(i, fn) for i in expr.index))
        else:
            names = [
                f.name for f in dataclasses.fields(expr) if isinstance(getattr(expr, f.name), Expr)
            ]
            expr = dataclasses.replace(expr, **{n: map_expr(getattr(expr, n), fn) for n in names})
    return fn(expr)


def map_loads(expr: Expr, fn) -> Expr:
    """``expr`` with every Load replaced by ``fn(load)``."""
    return map_expr(expr, lambda e: fn(e) if isinstance(e, Load) else e)


def renamed(stmt: Statement, name: str) -> Statement:
    """``stmt`` under another name (its domain and access tuples renamed too)."""

    def retag(text: str) -> str:
        return re.sub(r"^\{ \w+\[", f"{{ {name}[", text)

    def access(acc: Access) -> Access:
        return Access(acc.buffer, retag(acc.index))

    return dataclasses.replace(
        stmt, name=name, domain=retag(stmt.domain), write=access(stmt.write),
        expr=map_loads(stmt.expr, lambda ld: dataclasses.replace(ld, access=access(ld.access))),
    )  # fmt: skip


def gathers(expr: Expr) -> list[LoadAt]:
    """Every LoadAt in ``expr``, left to right."""
    found = [expr] if isinstance(expr, LoadAt) else []
    for child in children(expr):
        found.extend(gathers(child))
    return found


def checks(expr: Expr) -> list[Checked]:
    """Every Checked in ``expr``, left to right."""
    found = [expr] if isinstance(expr, Checked) else []
    for child in children(expr):
        found.extend(checks(child))
    return found


def within(x: Expr, size: Expr, site: CheckSite) -> Checked:
    """``x`` (an integer), checked to lie in [-size, size): an index that may count from
    the end of a dim of ``size`` (an int64 expression, e.g. an Extent)."""
    wide = x if x.dtype == "int64" else Cast("int64", x)
    low = Binary("bool", "ge", wide, Unary("int64", "neg", size))
    return Checked(x.dtype, x, Binary("bool", "and", low, Binary("bool", "lt", wide, size)), site)


def in_range(x: Expr, low: int, high: int, site: CheckSite) -> Checked:
    """``x`` (an integer), checked to lie in [low, high]."""
    wide = x if x.dtype == "int64" else Cast("int64", x)
    ok = Binary(
        "bool",
        "and",
        Binary("bool", "ge", wide, Const("int64", low)),
        Binary("bool", "le", wide, Const("int64", high)),
    )
    return Checked(x.dtype, x, ok, site)


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Checked):
        return (expr.x, expr.ok)
    if isinstance(expr, LoadAt):
        return expr.index
    if isinstance(expr, Unary | Cast):
        return (expr.x,)
    if isinstance(expr, Binary):
        return (expr.a, expr.b)
    if isinstance(expr, Select):
        return (expr.cond, expr.a, expr.b)
    return ()


# ---- statements, kernels, programs ------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """``write[index] = expr`` over every point of ``domain``, or, with ``reduce`` set,
    ``write[index] = write[index] <reduce> expr``. A reduction's init is its own earlier
    statement; the dims of the domain that the write does not use are the reduction dims.
    """

    name: str
    domain: str
    write: Access
    expr: Expr
    reduce: str | None = None


def statement_reads(stmt: Statement) -> frozenset[str]:
    """The buffers a statement's expression reads: its loads and gathers."""
    return frozenset({ld.access.buffer for ld in loads(stmt.expr)}
                     | {g.buffer for g in gathers(stmt.expr)})  # fmt: skip


@dataclass(frozen=True)
class Kernel:
    """What one ONNX node became: statements run in order, each over its whole domain."""

    name: str
    op_type: str
    statements: tuple[Statement, ...]

    def buffers(self) -> tuple[str, ...]:
        """Every buffer the kernel touches, in first-use order."""
        names: dict[str, None] = {}
        for stmt in self.statements:
            for load in loads(stmt.expr):
                names.setdefault(load.access.buffer)
            for gather in gathers(stmt.expr):
                names.setdefault(gather.buffer)
            names.setdefault(stmt.write.buffer)
        return tuple(names)

    def reads(self) -> frozenset[str]:
        return frozenset(name for s in self.statements for name in statement_reads(s))

    def writes(self) -> frozenset[str]:
        return frozenset(s.write.buffer for s in self.statements)


def storage(
    views: Mapping[str, str], slices: Mapping[str, tuple[str, int]], name: str
) -> tuple[str, int]:
    """(the buffer that owns ``name``'s storage, the element ``name`` starts at in it)."""
    start = 0
    while True:
        if name in views:
            name = views[name]
        elif name in slices:
            name, at = slices[name]
            start += at
        else:
            return name, start


@dataclass(frozen=True)
class Program:
    """A lowered model: kernels in execution order plus where every buffer lives.

    ``views`` maps a buffer to the buffer whose storage it shares (Reshape, Flatten,
    Squeeze, Unsqueeze, Identity): same bytes, another shape, no copy. ``slices`` maps a
    buffer to the buffer it is stored inside and the element it starts at (a Concat's
    part, written in place: krnl/ops/movement.py).
    """

    kernels: tuple[Kernel, ...]
    buffers: Mapping[str, Buffer]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=lambda: MappingProxyType({}))
    views: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    slices: Mapping[str, tuple[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    input_offsets: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Inputs whose code is laid out for where their data starts past a cache line, and
    that offset in bytes (krnl/lower.py's LowerContext.input_offset): it runs correctly
    from any start, fastest from that one."""

    def root(self, name: str) -> str:
        """The buffer that owns ``name``'s storage (following views and slices)."""
        return storage(self.views, self.slices, name)[0]

    def offset(self, name: str) -> int:
        """Where ``name``'s storage starts in its root's, in bytes."""
        return storage(self.views, self.slices, name)[1] * self.buffers[name].itemsize

    def shares_storage(self, name: str) -> bool:
        """Whether ``name`` is a view or a slice, or has one."""
        held = set(self.views.values()) | {c for c, _ in self.slices.values()}
        return name in self.views or name in self.slices or name in held

    def kernel(self, name: str) -> Kernel:
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        known = ", ".join(k.name for k in self.kernels)
        raise KeyError(f"no kernel named {name!r}; kernels are: {known}")
