"""Convolutions: Conv, ConvInteger and ConvTranspose (1-D, 2-D, 3-D, grouped).

A convolution is an init statement and one sum reduction over (n, [g,] m, out spatial..,
c-in-group, kernel spatial..). Padding is not a padded copy: a tap that falls outside
the input is simply not in the reduction's domain::

    S0: Y[n, m, o..] = B[m]                                          (or 0)
    S1: Y[n, g*Mg + m, o..] += X[n, g*Cg + c, s*o + d*k - p ..] * W[g*Mg + m, c, k..]
        over 0 <= s*o + d*k - p < size                   (for every spatial axis)

ConvTranspose is the same reduction in gather form (no scatter): output ``o`` reads input
``i = (o + p - d*k) / s`` wherever that is an integer in range, which the domain says with
an existential (stride) constraint::

    S1: Y[n, g*Mg + m, o..] += X[n, g*Cg + c, (o + p - d*k)/s ..] * W[g*Cg + c, m, k..]
        over exists e: o + p - d*k = s*e and 0 <= e < size

The group dim ``g`` only appears when ``group > 1``. Big 3x3 stride-1 Convs take
Winograd's F(2x2, 3x3) or F(4x4, 3x3) instead (krnl/ops/winograd.py), big 3x3 stride-2
ones F(4, 2) over the stride's phases (krnl/ops/winograd_s2.py), other strided ones the
phases of their input (krnl/ops/phases.py); CONV_ALGORITHMS lists every algorithm with
the condition that picks it, in the order they are tried. float16 sums accumulate in a float32
temp and are rounded once at the end. :class:`Axis` and :func:`window` (the sliding-window
geometry: auto_pad, pads, strides, dilations, ceil_mode) are shared with the pools;
:func:`channels` and :func:`contraction` with QLinearConv (krnl/ops/quant.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Expr, Statement
from polyonnx.krnl.islutil import row_major_strides
from polyonnx.krnl.lower import LowerContext, lowers

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

# ---- sliding-window geometry ------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """One spatial axis of a sliding window: output ``o`` tap ``k`` reads input
    ``stride*o + dilation*k - pad`` (a convolution or pool); for a transposed convolution,
    output ``o`` tap ``k`` reads input ``(o + pad - dilation*k) / stride``."""

    size: int
    kernel: int
    stride: int
    dilation: int
    pad: int
    pad_end: int
    out: int

    @property
    def span(self) -> int:
        return self.dilation * (self.kernel - 1) + 1

    def tap(self, o: str, k: str) -> str:
        """The input position output ``o`` reads at tap ``k``, an affine isl expression."""
        return affine([(self.stride, o), (self.dilation, k)], -self.pad)

    def inside(self, o: str, k: str) -> str:
        """The constraint that the tap lands in the input (not in the padding)."""
        return f"0 <= {self.tap(o, k)} < {self.size}"

    def in_padded(self, o: str, k: str) -> str:
        """The constraint that the tap lands in the input or its explicit padding (not in
        the extra room ceil_mode adds past the end)."""
        return f"{-self.pad} <= {self.tap(o, k)} < {self.size + self.pad_end}"


def affine(terms: Sequence[tuple[int, str]], offset: int = 0) -> str:
    """``2*o0 + k0 - 1``: an affine isl expression from (coefficient, dim) terms."""
    parts = [
        (coeff < 0, name if abs(coeff) == 1 else f"{abs(coeff)}*{name}")
        for coeff, name in terms
        if coeff != 0
    ]
    if offset or not parts:
        parts.append((offset < 0, str(abs(offset))))
    text = ("-" if parts[0][0] else "") + parts[0][1]
    for negative, mag in parts[1:]:
        text += (" - " if negative else " + ") + mag
    return text


def padded_axes(axes: Sequence[Axis]) -> tuple[Axis, ...]:
    """The same windows over the input copied into a padded temp: every tap of every
    output lands inside it, at ``stride*o + dilation*k`` (pad 0)."""
    return tuple(
        replace(a, size=max(a.pad + a.size, a.stride * (a.out - 1) + a.span), pad=0, pad_end=0)
        for a in axes
    )


def padded_copy(
    ctx: LowerContext,
    x: Buffer,
    axes: Sequence[Axis],
    fill: Expr,
    hint: str,
    flat: bool,
    lead: tuple[str, str] = ("n", "c"),
) -> tuple[Buffer, list[Statement]]:
    """A temp P holding X at offset ``pad`` along each spatial axis of ``axes``, and
    ``fill`` in every other cell (P's spatial sizes: :func:`padded_axes`)::

        S0: P[n, c, i..] = fill                        (the pad cells only)
        S1: P[n, c, i + pad ..] = X[n, c, i..]

    With ``flat``, P's spatial dims are stored as one (a row-major flattening), for reads
    along the flattened plane: its writes and reads then name one buffer, as dependences
    are computed per buffer name. ``lead`` names the batch and channel dims: loops are
    named after dims, and a schedule that marks the consumer's ``c`` loop must not mark
    the copy's too."""
    sizes = [a.size for a in padded_axes(axes)]
    strides = row_major_strides(sizes)
    full = (*x.shape[:2], *sizes)
    src = ctx.temp(hint, (*x.shape[:2], math.prod(sizes)) if flat else full, x.dtype)
    dims = [*lead, *kb.dims("i", len(axes))]

    def at(index: list[str]) -> list[str]:
        if not flat:
            return [*lead, *index]
        return [*lead, " + ".join(f"{st}*({i})" for st, i in zip(strides, index, strict=True))]

    pads = [
        f"{i} < {a.pad} or {i} >= {a.pad + a.size}" for i, a in zip(dims[2:], axes, strict=True)
    ]
    pad_cells = Statement(
        "S0",
        domain("S0", dims, full, ["(" + " or ".join(pads) + ")"]),
        kb.access(src.name, "S0", dims, at(dims[2:])),
        fill,
    )
    moved = [affine([(1, i)], a.pad) for i, a in zip(dims[2:], axes, strict=True)]
    copy = Statement(
        "S1",
        kb.box("S1", dims, x.shape),
        kb.access(src.name, "S1", dims, at(moved)),
        kb.load(kb.access(x.name, "S1", dims, dims), x.dtype),
    )
    return src, [pad_cells, copy]


def flat_windows(
    ctx: LowerContext,
    src: Buffer,
    out: str,
    dtype: str,
    plane: Sequence[int],
    outs: Sequence[int],
    taps: Sequence[tuple[tuple[int, ...], int]],
    term: Callable[[tuple[int, ...], Expr], Expr],
    combine: Callable[[list[Expr]], Expr],
) -> list[Statement]:
    """A window over a padded copy P (stored flat) as a 1-D stencil: output (o0, o1) at
    flat position q = o0*W + o1 of a ``plane`` (W its row length; for a stride-1 window
    the padded input's own plane, :func:`plane_taps`) reads P[q + off(k)] at each tap k
    of ``taps`` (tap, offset), so SIMD runs along whole planes rather than along rows of
    7 or 14 outputs; the positions between rows are computed and dropped::

        S2: F[n, c, q] = combine(term(k, P[n, c, q + off(k)]) for every tap k)
        S3: Y[n, c, o..] = F[n, c, o0*W + o1]           (``outs``: Y's spatial sizes)
    """
    n, c = src.shape[:2]
    strides = row_major_strides(plane)
    length = sum((o - 1) * st for o, st in zip(outs, strides, strict=True)) + 1  # to the last
    windows_out = ctx.temp(f"{out}.flat", (n, c, length), dtype)
    dims = ["n", "c", "q"]
    terms = []
    for tap, offset in taps:
        at = ["n", "c", affine([(1, "q")], offset)]
        terms.append(term(tap, kb.load(kb.access(src.name, "S2", dims, at), src.dtype)))
    windows = Statement(
        "S2",
        kb.box("S2", dims, (n, c, length)),
        kb.access(windows_out.name, "S2", dims, dims),
        combine(terms),
    )
    o = ["n", "c", *kb.dims("o", len(outs))]
    at = ["n", "c", affine([(st, d) for st, d in zip(strides, o[2:], strict=True)])]
    gather = Statement(
        "S3",
        kb.box("S3", o, (n, c, *outs)),
        kb.access(out, "S3", o, o),
        kb.load(kb.access(windows_out.name, "S3", o, at), dtype),
    )
    return [windows, gather]


def plane_taps(axes: Sequence[Axis]) -> tuple[list[int], list[tuple[tuple[int, ...], int]]]:
    """For a stride-1 window over its padded copy (``axes``: the padded axes): the plane
    (the padded sizes) and each tap's offset in it, ``sum(dilation * k * stride)``."""
    plane = [a.size for a in axes]
    strides = row_major_strides(plane)
    taps = [
        (tap, sum(a.dilation * k * st for a, k, st in zip(axes, tap, strides, strict=True)))
        for tap in np.ndindex(*(a.kernel for a in axes))
    ]
    return plane, taps


def balanced(op: str, terms: Sequence[Expr]) -> Expr:
    """``t0 <op> t1 <op> ...`` as a balanced tree: a 3x3 window's 8 operations then
    depend on each other 4 deep, not 8 (a NaN-propagating max is 4 instructions, ~6 cycles
    of latency on Zen 4, so a chain of 8 held a 7x7 MaxPool's rows to its latency)."""
    while len(terms) > 1:
        pairs = [kb.binary(op, a, b) for a, b in zip(terms[::2], terms[1::2], strict=False)]
        terms = pairs + list(terms[len(pairs) * 2 :])
    return terms[0]


def domain(
    stmt: str,
    dims: Sequence[str],
    shape: Sequence[int],
    constraints: Sequence[str] = (),
    exists: Sequence[str] = (),
    exists_constraints: Sequence[str] = (),
) -> str:
    """``{ stmt[dims] : box and constraints and exists (e.. : ...) }``."""
    parts = [f"0 <= {d} < {n}" for d, n in zip(dims, shape, strict=True)] + list(constraints)
    if exists:
        parts.append(f"exists ({', '.join(exists)} : {' and '.join(exists_constraints)})")
    head = f"{stmt}[{', '.join(dims)}]"
    return f"{{ {head} : {' and '.join(parts)} }}" if parts else f"{{ {head} }}"


def ints(node: Node, name: str, count: int, default: int) -> list[int]:
    """An ints attribute of ``count`` entries (``default`` each when absent)."""
    value = node.attr(name)
    if value is None or len(value) == 0:
        return [default] * count
    if len(value) != count:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: {name} has {len(value)} entries, expected {count}"
        )
    return [int(v) for v in value]


def auto_pad(node: Node) -> str:
    mode = str(node.attr("auto_pad", "NOTSET") or "NOTSET")
    if mode not in AUTO_PADS:
        raise LoweringError(f"{node.op_type} node {node.name!r}: unknown auto_pad {mode!r}")
    return mode


def window(
    node: Node, spatial: Sequence[int], kernel: Sequence[int], ceil_mode: bool = False
) -> tuple[Axis, ...]:
    """The sliding window of a Conv or pool node over an input of ``spatial`` extents."""
    rank = len(spatial)
    strides = ints(node, "strides", rank, 1)
    dilations = ints(node, "dilations", rank, 1)
    pads = ints(node, "pads", 2 * rank, 0)
    mode = auto_pad(node)
    if min(strides + dilations + list(kernel), default=1) < 1:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: kernel {list(kernel)}, strides {strides} and "
            f"dilations {dilations} must be positive"
        )
    axes = []
    for r, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations, strict=True)):
        span = d * (k - 1) + 1
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
            total = max(0, (out - 1) * s + span - size)
            begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
            end = total - begin
        else:
            begin, end = (pads[r], pads[rank + r]) if mode == "NOTSET" else (0, 0)
            room = size + begin + end - span
            out = (-(-room // s) if ceil_mode else room // s) + 1
            if ceil_mode and (out - 1) * s >= size + begin:  # the last window starts in the pad
                out -= 1
        if out < 1:
            raise LoweringError(
                f"{node.op_type} node {node.name!r}: the window (kernel {k}, dilation {d}) "
                f"does not fit axis {r + 2} of size {size} with pads ({begin}, {end})"
            )
        axes.append(Axis(size, k, s, d, begin, end, out))
    return tuple(axes)


def kernel_shape(node: Node, weights: Sequence[int]) -> tuple[int, ...]:
    """The kernel's spatial shape: the weights' (the attribute, if given, must agree)."""
    given = node.attr("kernel_shape")
    if given is not None and len(given) and tuple(int(k) for k in given) != tuple(weights):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: kernel_shape {list(given)} disagrees with "
            f"the weights' spatial shape {list(weights)}"
        )
    return tuple(int(k) for k in weights)


def spatial_input(node: Node, x: Buffer) -> None:
    if len(x.shape) < 3:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: input must be N x C x D1 x ..., got shape "
            f"{list(x.shape)}"
        )


def accumulator(ctx: LowerContext, out: Buffer) -> Buffer:
    """Where a sum into ``out`` accumulates: ``out`` itself, or a float32 temp for float16
    (the caller rounds it into ``out`` with :func:`round_into`)."""
    if out.dtype != "float16":
        return out
    return ctx.temp(out.name + ".acc", out.shape, "float32")


def round_into(out: Buffer, acc: Buffer, stmt: str) -> Statement:
    """``out = acc`` over ``out``'s shape, cast to ``out``'s dtype."""
    dims = kb.dims("d", len(out.shape))
    value = kb.load(kb.access(acc.name, stmt, dims, dims), acc.dtype)
    return Statement(
        stmt,
        kb.box(stmt, dims, out.shape),
        kb.access(out.name, stmt, dims, dims),
        kb.cast(value, out.dtype),
    )


# ---- Conv, ConvInteger -------------------------------------------------------------------


@dataclass(frozen=True)
class Channels:
    """The dims and channel indices of a grouped contraction: ``c_in`` input channels
    per group, ``m_out`` output channels per group."""

    group: int
    c_in: int
    m_out: int
    rank: int

    @property
    def out_dims(self) -> list[str]:
        return kb.dims("o", self.rank)

    @property
    def k_dims(self) -> list[str]:
        return kb.dims("k", self.rank)

    @property
    def head(self) -> list[str]:
        return ["g", "m"] if self.group > 1 else ["m"]

    def dims(self) -> list[str]:
        return ["n", *self.head, *self.out_dims, "c", *self.k_dims]

    @property
    def head_sizes(self) -> list[int]:
        return [self.group, self.m_out] if self.group > 1 else [self.m_out]

    def shape(self, n: int, out: Sequence[int], kernel: Sequence[int]) -> list[int]:
        return [n, *self.head_sizes, *out, self.c_in, *kernel]

    @property
    def m(self) -> str:
        """The output channel as an index."""
        return affine([(self.m_out, "g"), (1, "m")]) if self.group > 1 else "m"

    @property
    def c(self) -> str:
        """The input channel as an index."""
        return affine([(self.c_in, "g"), (1, "c")]) if self.group > 1 else "c"


def channels(node: Node, x: Buffer, w: Buffer, transposed: bool = False) -> Channels:
    """Check a (transposed) convolution's input (N x C x D1 x ...), its weights' rank and
    its channel counts; returns its Channels. Conv weights are [M, C/group, k..];
    ConvTranspose weights are [C, M/group, k..]."""
    spatial_input(node, x)
    if len(w.shape) != len(x.shape):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: weights of shape {list(w.shape)} do not "
            f"match an input of rank {len(x.shape)}"
        )
    group = int(node.attr("group", 1))
    c = x.shape[1]
    w_in, w_out = (w.shape[0], w.shape[1]) if transposed else (w.shape[1], w.shape[0])
    ok = group >= 1 and c % group == 0
    ok = ok and w_in == (c if transposed else c // group)
    ok = ok and (transposed or w_out % group == 0)
    if not ok:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: {c} input channels, group {group} "
            f"and weights of shape {list(w.shape)} do not agree"
        )
    m_out = w_out if transposed else w_out // group
    return Channels(group, c // group, m_out, len(x.shape) - 2)


def contraction(
    ch: Channels,
    batch: int,
    axes: Sequence[Axis],
    acc: Buffer,
    product: Expr,
    constraints: Sequence[str],
    exists: Sequence[str] = (),
    exists_constraints: Sequence[str] = (),
    name: str = "S1",
) -> Statement:
    """``S1: acc[n, g*Mg + m, o..] += product`` over (n, [g,] m, o.., c, k..) cut by
    ``constraints`` (and existential ``exists``): the reduction of every convolution,
    Conv, ConvInteger, QLinearConv and ConvTranspose alike."""
    dims = ch.dims()
    shape = ch.shape(batch, [a.out for a in axes], [a.kernel for a in axes])
    return Statement(
        name,
        domain(name, dims, shape, constraints, exists, exists_constraints),
        kb.access(acc.name, name, dims, ["n", ch.m, *ch.out_dims]),
        product,
        "add",
    )


def _init(ctx: LowerContext, node: Node, acc: Buffer, bias: str, name: str = "S0") -> Statement:
    """``S0: acc[n, m, o..] = B[m]`` (or 0)."""
    dims = ["n", "m", *kb.dims("o", len(acc.shape) - 2)]
    value: Expr = kb.const(0, acc.dtype)
    b = conv_bias(ctx, node, acc) if bias else None
    if b is not None:
        value = kb.cast(kb.load(kb.access(bias, name, dims, ["m"]), b.dtype), acc.dtype)
    return Statement(
        name, kb.box(name, dims, acc.shape), kb.access(acc.name, name, dims, dims), value
    )


def conv_bias(ctx: LowerContext, node: Node, out: Buffer) -> Buffer | None:
    """The Conv's bias (input 2), one value per output channel, or None without one."""
    if not node.input(2):
        return None
    b = ctx.buffer(node.input(2))
    if b.shape != (out.shape[1],):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: bias has shape {list(b.shape)}, "
            f"expected [{out.shape[1]}]"
        )
    return b


@dataclass(frozen=True)
class ConvCase:
    """One Conv node as :func:`lower_conv` has read it: what every algorithm's condition
    and lowering look at. ``w`` is not yet registered (phases read a re-laid copy)."""

    ctx: LowerContext
    node: Node
    x: Buffer
    w: Buffer
    weights: np.ndarray | None
    ch: Channels
    axes: tuple[Axis, ...]
    out: Buffer
    acc: Buffer

    @property
    def integer(self) -> bool:
        return self.node.op_type == "ConvInteger"


@dataclass(frozen=True)
class ConvAlgorithm:
    """A way to lower a Conv: ``fits`` returns what ``lower`` needs (a Winograd variant,
    a phase plan, True), or None where the algorithm does not apply."""

    name: str
    fits: Callable[[ConvCase], object | None]
    lower: Callable[[ConvCase, object], None]


@lowers("Conv", "ConvInteger")
def lower_conv(ctx: LowerContext, node: Node) -> None:
    """Lower with the first algorithm of CONV_ALGORITHMS that fits."""
    x, w = ctx.buffer(node.inputs[0]), _unregistered(ctx, node.inputs[1])
    ch = channels(node, x, w)
    axes = window(node, x.shape[2:], kernel_shape(node, w.shape[2:]))
    out_shape = (x.shape[0], w.shape[0], *(a.out for a in axes))
    integer = node.op_type == "ConvInteger"
    out = ctx.output(node.outputs[0], out_shape, "int32" if integer else x.dtype)
    acc = accumulator(ctx, out)
    case = ConvCase(ctx, node, x, w, ctx.constant(node.inputs[1]), ch, axes, out, acc)
    for algorithm in CONV_ALGORITHMS:
        fit = algorithm.fits(case)
        if fit is not None:
            algorithm.lower(case, fit)
            return


def _float(condition: Callable[[ConvCase], bool]) -> Callable[[ConvCase], object | None]:
    """A condition that holds for float Convs only (not ConvInteger)."""
    return lambda case: True if not case.integer and condition(case) else None


def _winograd_fits(case: ConvCase) -> object | None:
    from polyonnx.krnl.ops import winograd  # (it builds on this module)

    return None if case.integer else winograd.fits(case.x, case.weights, case.axes, case.ch.group)


def _winograd(case: ConvCase, variant: object) -> None:
    from polyonnx.krnl.ops import winograd

    winograd.lower(case.ctx, case.node, case.x, case.weights, case.axes, case.out, variant)


def _winograd_s2_fits(case: ConvCase) -> bool:
    from polyonnx.krnl.ops import winograd_s2

    return winograd_s2.fits(case.x, case.weights, case.axes, case.ch.group)


def _winograd_s2(case: ConvCase, _: object) -> None:
    from polyonnx.krnl.ops import winograd_s2

    winograd_s2.lower(case.ctx, case.node, case.x, case.weights, case.axes, case.out)


def _phases_fits(case: ConvCase) -> object | None:
    from polyonnx.krnl.ops import phases

    if case.integer or _depthwise_2d(case.ch, case.axes, case.x):
        return None
    return phases.plan(case.axes, case.x, case.weights)


def _phases(case: ConvCase, plan: object) -> None:
    """V, not W, is read: W is not registered."""
    from polyonnx.krnl.ops import phases

    ctx, node, ch = case.ctx, case.node, case.ch
    head = list(zip(ch.head, ch.head_sizes, strict=True))
    copy, update = phases.statements(ctx, case.x, case.weights, plan, case.acc, head, (ch.m, ch.c))
    ctx.kernel(node, [copy, _init(ctx, node, case.acc, node.input(2), "S1"), update])


def _flat_depthwise_conv(case: ConvCase, _: object) -> None:
    w = case.ctx.buffer(case.node.inputs[1])
    stmts = _flat_depthwise_statements(case.ctx, case.node, case.x, w, case.out, case.axes)
    case.ctx.kernel(case.node, stmts)


def _phased_depthwise_conv(case: ConvCase, _: object) -> None:
    w = case.ctx.buffer(case.node.inputs[1])
    stmts = _phased_depthwise_statements(case.ctx, case.node, case.x, w, case.out, case.axes)
    case.ctx.kernel(case.node, stmts)


def _padded_direct(case: ConvCase, _: object) -> None:
    """The direct reduction over a zero-padded copy of the input (see PADDED_ROW)."""
    w = case.ctx.buffer(case.node.inputs[1])
    zero = kb.const(0, case.x.dtype)
    hint = f"{case.out.name}.padded"
    x, copy = padded_copy(case.ctx, case.x, case.axes, zero, hint, flat=False, lead=("pn", "pc"))
    _direct_statements(replace(case, x=x, w=w, axes=padded_axes(case.axes)), copy)


def _subsampled_direct(case: ConvCase, _: object) -> None:
    """The direct reduction over a subsampled copy of the input (see _subsamples)."""
    w = case.ctx.buffer(case.node.inputs[1])
    x, copy = subsampled_copy(case.ctx, case.x, case.axes, f"{case.out.name}.subsampled")
    axes = tuple(replace(a, size=a.out, stride=1) for a in case.axes)
    _direct_statements(replace(case, x=x, w=w, axes=axes), copy)


def _direct(case: ConvCase, _: object) -> None:
    _direct_statements(replace(case, w=case.ctx.buffer(case.node.inputs[1])), [])


def _direct_statements(case: ConvCase, copy: list[Statement]) -> None:
    """The init and the reduction over the input (or over ``copy``'s temp)."""
    ctx, node, ch, axes, acc, out = case.ctx, case.node, case.ch, case.axes, case.acc, case.out
    first = len(copy)  # statements S<first>.. follow the copy's
    update, init = f"S{first + 1}", f"S{first}"
    dims, o, k = ch.dims(), ch.out_dims, ch.k_dims
    taps = [a.tap(o[r], k[r]) for r, a in enumerate(axes)]
    xs = kb.load(kb.access(case.x.name, update, dims, ["n", ch.c, *taps]), case.x.dtype)
    ws = kb.load(kb.access(case.w.name, update, dims, [ch.m, "c", *k]), case.w.dtype)
    if case.integer:
        xs, ws = _centred(ctx, node, xs, ws, dims, ch)
    else:
        xs, ws = kb.cast(xs, acc.dtype), kb.cast(ws, acc.dtype)
    inside = [a.inside(o[r], k[r]) for r, a in enumerate(axes) if a.pad or a.pad_end]
    product = kb.binary("mul", xs, ws)
    bias = "" if case.integer else node.input(2)
    stmts = [
        *copy,
        _init(ctx, node, acc, bias, init),
        contraction(ch, out.shape[0], axes, acc, product, inside, name=update),
    ]
    if acc is not out:
        stmts.append(round_into(out, acc, f"S{first + 2}"))
    ctx.kernel(node, stmts)


def _unregistered(ctx: LowerContext, name: str) -> Buffer:
    """The Buffer of ``name``, a constant not yet registered as one of the program's (a
    lowering that reads a re-laid copy of it leaves it out)."""
    value = ctx.constant(name)
    if value is None or name in ctx.buffers:
        return ctx.buffer(name)
    return Buffer(name, tuple(value.shape), value.dtype.name)


PADDED_ROW = 64
"""Output rows from which a padded stride-1 depthwise 2-D Conv first copies its input
into a zero-padded temp: every row block of the depthwise schedule
(schedule/heuristics/depthwise.py) then has all its taps inside, and runs as vector code; reading
the input in place, a row's first and last blocks leave out the taps that fall in the
padding, and run as scalar code. Strided rows keep reading in place: they would read the
copy with a stride, and the copy is of an input 4x the output. The measurements are in
docs/measurements.md."""


def _subsamples(axes: Sequence[Axis]) -> bool:
    """Whether this Conv reads its input through a subsampled copy: a strided 1x1 Conv
    without padding (ResNet's projection shortcuts). Its B is then one contiguous run
    per channel, packed with whole vectors, where the strided input's runs are output
    rows of every other value, each packed with two masked loads, a shuffle and, where
    a row ends inside a vector, masked stores into two micro-panels. The measurements
    are in docs/measurements.md."""
    strided = any(a.stride > 1 for a in axes)
    return strided and all(a.kernel == 1 and a.pad == 0 and a.pad_end == 0 for a in axes)


def subsampled_copy(
    ctx: LowerContext, x: Buffer, axes: Sequence[Axis], hint: str
) -> tuple[Buffer, list[Statement]]:
    """A temp T holding the input positions a strided 1x1 window reads::

        S0: T[pn, pc, i..] = X[pn, pc, stride*i ..]

    The copy's batch and channel dims are named apart from the Conv's (see padded_copy)."""
    src = ctx.temp(hint, (*x.shape[:2], *(a.out for a in axes)), x.dtype)
    dims = ["pn", "pc", *kb.dims("i", len(axes))]
    read = ["pn", "pc", *(affine([(a.stride, i)]) for i, a in zip(dims[2:], axes, strict=True))]
    copy = Statement(
        "S0",
        kb.box("S0", dims, src.shape),
        kb.access(src.name, "S0", dims, dims),
        kb.load(kb.access(x.name, "S0", dims, read), x.dtype),
    )
    return src, [copy]


def _pads_a_copy(ch: Channels, axes: Sequence[Axis], x: Buffer) -> bool:
    """Whether this Conv is read through a zero-padded copy: see PADDED_ROW."""
    return _padded_depthwise(ch, axes, x) and axes[-1].out >= PADDED_ROW


def _depthwise_2d(ch: Channels, axes: Sequence[Axis], x: Buffer) -> bool:
    """A float32 2-D depthwise Conv (one input channel a group)."""
    return ch.group > 1 and ch.c_in == 1 and len(axes) == 2 and x.dtype == "float32"


def _padded_depthwise(ch: Channels, axes: Sequence[Axis], x: Buffer) -> bool:
    """A float32 2-D depthwise Conv with stride 1 and padding."""
    if not _depthwise_2d(ch, axes, x):
        return False
    return any(a.pad or a.pad_end for a in axes) and all(a.stride == 1 for a in axes)


FLAT_TAPS = 49
"""Window points (7 x 7) up to which a depthwise Conv with short rows is one unrolled
expression per output (:func:`_flat_depthwise_statements`)."""


def _flat_depthwise(ch: Channels, axes: Sequence[Axis], x: Buffer) -> bool:
    """Whether this Conv runs along the flattened plane of a zero-padded copy: a padded
    stride-1 depthwise Conv (one output channel a group) whose rows are too short for
    the depthwise schedule (PADDED_ROW). The measurements are in docs/measurements.md."""
    taps = math.prod(a.kernel for a in axes)
    return (
        _padded_depthwise(ch, axes, x)
        and ch.m_out == 1
        and axes[-1].out < PADDED_ROW
        and taps <= FLAT_TAPS
    )


def _weighted_sum(ctx: LowerContext, node: Node, w: Buffer, out: Buffer):
    """``term`` and ``combine`` for :func:`flat_windows`: each tap's value times its
    weight W[c, 0, k..], the products summed as a balanced tree, plus the bias B[c]."""
    dims = ["n", "c", "q"]
    bias = conv_bias(ctx, node, out)

    def term(taps: tuple[int, ...], value: Expr) -> Expr:
        weight = kb.load(kb.access(w.name, "S2", dims, ["c", "0", *map(str, taps)]), w.dtype)
        return kb.binary("mul", value, weight)

    def combine(terms: list[Expr]) -> Expr:
        total = balanced("add", terms)
        if bias is None:
            return total
        value = kb.load(kb.access(bias.name, "S2", dims, ["c"]), bias.dtype)
        return kb.binary("add", total, value)

    return term, combine


def _phased_depthwise(ch: Channels, axes: Sequence[Axis], x: Buffer) -> bool:
    """Whether this strided depthwise Conv (one output channel a group) runs over the
    stride phases of its zero-padded input (:func:`_phased_depthwise_statements`)."""
    taps = math.prod(a.kernel for a in axes)
    if not _depthwise_2d(ch, axes, x) or ch.m_out != 1 or taps > FLAT_TAPS:
        return False
    if all(a.stride == 1 for a in axes):
        return False
    return axes[-1].out < PHASED_ROW or taps >= 4 * math.prod(a.stride for a in axes)


PHASED_ROW = 48
"""Strided depthwise Convs with output rows shorter than this (or with 4 taps an input
value or more) run over the stride phases of their input: the depthwise schedule's row
blocks are then mostly edge blocks, which run scalar. Longer rows keep reading in place:
the phase copy is a pass over an input 4x the output. The measurements are in
docs/measurements.md."""


def _phased_depthwise_statements(
    ctx: LowerContext, node: Node, x: Buffer, w: Buffer, out: Buffer, axes: Sequence[Axis]
) -> list[Statement]:
    """A strided depthwise Conv over the stride phases of its zero-padded input: phase
    (a0, a1) holds the padded input's rows a0, a0 + s0, .. and columns a1, a1 + s1, ..
    (L0 x L1 values), so that tap k of output o reads phase ((d*k) mod s) at o + (d*k)
    div s, with stride 1. Every output is then one unrolled sum of its taps along the
    flattened phase planes (:func:`flat_windows`), as with stride 1::

        S0: P[n, c, a.., i..] = 0                  where s*i + a - pad is outside X
        S1: P[n, c, a.., i..] = X[n, c, s*i + a - pad ..]     elsewhere
        S2: F[n, c, q] = (sum over taps k of P[n, c, q + off(k)] * W[c, 0, k..]) + B[c]
        S3: Y[n, c, o..] = F[n, c, o0*L1 + o1]
    """
    n, c = x.shape[:2]
    padded = padded_axes(axes)
    lengths = [-(-p.size // a.stride) for p, a in zip(padded, axes, strict=True)]
    sizes = [*(a.stride for a in axes), *lengths]  # after (n, c): phase a.., position i..
    strides = row_major_strides(sizes)
    src = ctx.temp(f"{out.name}.phases", (n, c, math.prod(sizes)), x.dtype)
    dims = ["pn", "pc", *kb.dims("a", 2), *kb.dims("i", 2)]
    at = ["pn", "pc", affine(list(zip(strides, dims[2:], strict=True)))]
    reads = [
        affine([(a.stride, i), (1, ph)], -a.pad)
        for a, i, ph in zip(axes, dims[4:], dims[2:4], strict=True)
    ]
    inside = [f"0 <= {r} < {a.size}" for r, a in zip(reads, axes, strict=True)]
    outside = " or ".join(f"{r} < 0 or {r} >= {a.size}" for r, a in zip(reads, axes, strict=True))
    fill = Statement(
        "S0",
        domain("S0", dims, (n, c, *sizes), [f"({outside})"]),
        kb.access(src.name, "S0", dims, at),
        kb.const(0, x.dtype),
    )
    copy = Statement(
        "S1",
        domain("S1", dims, (n, c, *sizes), inside),
        kb.access(src.name, "S1", dims, at),
        kb.load(kb.access(x.name, "S1", dims, ["pn", "pc", *reads]), x.dtype),
    )
    taps = []
    for tap in np.ndindex(*(a.kernel for a in axes)):
        reach = [a.dilation * k for a, k in zip(axes, tap, strict=True)]
        where = [r % a.stride for r, a in zip(reach, axes, strict=True)]
        where += [r // a.stride for r, a in zip(reach, axes, strict=True)]
        taps.append((tap, sum(st * v for st, v in zip(strides, where, strict=True))))
    term, combine = _weighted_sum(ctx, node, w, out)
    outs = [a.out for a in axes]
    windows = flat_windows(ctx, src, out.name, out.dtype, lengths, outs, taps, term, combine)
    return [fill, copy, *windows]


def _flat_depthwise_statements(
    ctx: LowerContext, node: Node, x: Buffer, w: Buffer, out: Buffer, axes: Sequence[Axis]
) -> list[Statement]:
    """A short-row depthwise Conv as a window over the flattened plane of its zero-padded
    input (:func:`flat_windows`, as the small pools do): every output one unrolled sum
    of its taps and the bias, SIMD along whole planes (a 28 x 28 plane is 53 vectors,
    not 28 rows of 2 with scalar edges), and no output read and written once per tap::

        S2: F[n, c, q] = (sum over taps k of P[n, c, q + off(k)] * W[c, 0, k..]) + B[c]
    """
    src, copy = padded_copy(ctx, x, axes, kb.const(0, x.dtype), f"{out.name}.padded", True)
    term, combine = _weighted_sum(ctx, node, w, out)
    padded = padded_axes(axes)
    plane, taps = plane_taps(padded)
    outs = [a.out for a in padded]
    return [*copy, *flat_windows(ctx, src, out.name, out.dtype, plane, outs, taps, term, combine)]


def _centred(
    ctx: LowerContext, node: Node, xs: Expr, ws: Expr, dims: list[str], ch: Channels
) -> tuple[Expr, Expr]:
    """ConvInteger's ``x - x_zero_point`` and ``w - w_zero_point`` (per output channel or
    scalar) as int32. A padded tap is not in the domain, i.e. it counts as the zero point."""
    xs, ws = kb.cast(xs, "int32"), kb.cast(ws, "int32")
    if node.input(2):
        xz = ctx.buffer(node.input(2))
        if xz.size != 1:
            raise LoweringError(
                f"ConvInteger node {node.name!r}: x_zero_point must be a scalar, got shape "
                f"{list(xz.shape)}"
            )
        xs = kb.binary("sub", xs, kb.cast(_scalar(ctx, xz, "S1", dims), "int32"))
    if node.input(3):
        wz = ctx.buffer(node.input(3))
        if wz.size == 1:
            wzp = _scalar(ctx, wz, "S1", dims)
        elif wz.shape == (ch.m_out * ch.group,):
            wzp = kb.load(kb.access(wz.name, "S1", dims, [ch.m]), wz.dtype)
        else:
            raise LoweringError(
                f"ConvInteger node {node.name!r}: w_zero_point must be a scalar or have one "
                f"entry per output channel, got shape {list(wz.shape)}"
            )
        ws = kb.binary("sub", ws, kb.cast(wzp, "int32"))
    return xs, ws


def _scalar(ctx: LowerContext, buf: Buffer, stmt: str, dims: list[str]) -> Expr:
    value = ctx.constant(buf.name)
    if value is not None:
        return kb.const(value.reshape(()).item(), buf.dtype)
    return kb.load(kb.access(buf.name, stmt, dims, ["0"] * len(buf.shape)), buf.dtype)


# ---- ConvTranspose -----------------------------------------------------------------------


CONV_ALGORITHMS: tuple[ConvAlgorithm, ...] = (
    ConvAlgorithm("winograd", _winograd_fits, _winograd),  # F(2x2, 3x3) or F(4x4, 3x3)
    ConvAlgorithm("winograd_s2", _float(_winograd_s2_fits), _winograd_s2),
    ConvAlgorithm("phases", _phases_fits, _phases),
    ConvAlgorithm(
        "flat_depthwise", _float(lambda c: _flat_depthwise(c.ch, c.axes, c.x)), _flat_depthwise_conv
    ),
    ConvAlgorithm(
        "phased_depthwise",
        _float(lambda c: _phased_depthwise(c.ch, c.axes, c.x)),
        _phased_depthwise_conv,
    ),
    ConvAlgorithm(
        "padded_depthwise", _float(lambda c: _pads_a_copy(c.ch, c.axes, c.x)), _padded_direct
    ),
    ConvAlgorithm("subsampled_1x1", _float(lambda c: _subsamples(c.axes)), _subsampled_direct),
    ConvAlgorithm("direct", lambda _: True, _direct),
)
"""How a Conv is lowered: the first of these whose condition holds, in this order."""


def transpose_window(node: Node, spatial: Sequence[int], kernel: Sequence[int]) -> tuple[Axis, ...]:
    """The geometry of a ConvTranspose: pads from ``pads``, or generated from
    ``output_shape`` / auto_pad SAME_* (the odd unit of padding goes at the end for
    SAME_UPPER, at the start otherwise, as the spec, its conformance cases and
    onnxruntime agree); ``output_padding`` extends the end. An ``output_shape``
    larger than the full result extends it at the end (positions only the bias reaches);
    SAME_* gives ``min(full, input * stride)``, as onnx shape inference and onnxruntime do."""
    rank = len(spatial)
    strides = ints(node, "strides", rank, 1)
    dilations = ints(node, "dilations", rank, 1)
    extra = ints(node, "output_padding", rank, 0)
    pads = ints(node, "pads", 2 * rank, 0)
    mode = auto_pad(node)
    wanted = node.attr("output_shape")
    wanted = [int(v) for v in wanted][-rank:] if wanted is not None and len(wanted) else None
    if wanted is not None and len(wanted) != rank:
        raise LoweringError(
            f"ConvTranspose node {node.name!r}: output_shape {list(wanted)} has the wrong rank"
        )
    axes = []
    for r, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations, strict=True)):
        full = s * (size - 1) + extra[r] + d * (k - 1) + 1
        if wanted is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
            out = wanted[r] if wanted is not None else size * s
            total = max(0, full - out)
            if wanted is None:
                out = full - total  # SAME never grows the output past the full result
            begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
            end = total - begin
        else:
            begin, end = (pads[r], pads[rank + r]) if mode == "NOTSET" else (0, 0)
            out = full - begin - end
        if out < 1:
            raise LoweringError(
                f"ConvTranspose node {node.name!r}: output axis {r + 2} would have size {out}"
            )
        axes.append(Axis(size, k, s, d, begin, end, out))
    return tuple(axes)


@lowers("ConvTranspose")
def lower_conv_transpose(ctx: LowerContext, node: Node) -> None:
    x, w = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    ch = channels(node, x, w, transposed=True)
    axes = transpose_window(node, x.shape[2:], kernel_shape(node, w.shape[2:]))
    out_shape = (x.shape[0], ch.m_out * ch.group, *(a.out for a in axes))
    out = ctx.output(node.outputs[0], out_shape, x.dtype)
    acc = accumulator(ctx, out)

    dims, o, k = ch.dims(), ch.out_dims, ch.k_dims
    index, constraints, exists, exists_constraints = [], [], [], []
    for r, a in enumerate(axes):
        source = affine([(1, o[r]), (-a.dilation, k[r])], a.pad)  # = stride * input index
        if a.stride == 1:
            index.append(source)
            constraints.append(f"0 <= {source} < {a.size}")
            continue
        index.append(f"floor(({source})/{a.stride})")
        exists.append(f"e{r}")
        exists_constraints.append(f"{source} = {a.stride}*e{r} and 0 <= e{r} < {a.size}")
    xs = kb.load(kb.access(x.name, "S1", dims, ["n", ch.c, *index]), x.dtype)
    ws = kb.load(kb.access(w.name, "S1", dims, [ch.c, "m", *k]), w.dtype)
    product = kb.binary("mul", kb.cast(xs, acc.dtype), kb.cast(ws, acc.dtype))
    update = contraction(
        ch, x.shape[0], axes, acc, product, constraints, exists, exists_constraints
    )
    stmts = [_init(ctx, node, acc, node.input(2)), update]
    if acc is not out:
        stmts.append(round_into(out, acc, "S2"))
    ctx.kernel(node, stmts)
