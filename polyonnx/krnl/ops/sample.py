"""Sampling and re-blocking: GridSample, AffineGrid, Col2Im and CenterCropPad.

GridSample reads the input at coordinates taken from the grid, so its reads are
LoadAts at computed indices. Per spatial dim ``m`` the source coordinate is computed once
per grid point into a temp (denormalised from [-1, 1], then clamped or reflected back
into the image as ``padding_mode`` says, exactly in the reference's order), and the
output is a reduction over the interpolation taps, one tap dim per spatial dim::

    S_m:  coord_m[n, h..] = pad(denormalize(grid[n, h.., r-1-m]))        m < r
    S_r:  y[n, c, h..] = 0
    S_r+1 y[n, c, h..] += prod_m w(frac_m, t_m) * x[n, c, .., floor_m + t_m, ..]
                                          over taps t_m < 2 (linear) or 4 (cubic)

Nearest is a single gather at ``rint(coordinate)``. ``zeros`` padding reads 0 outside
the image (a Select around the LoadAt), ``border`` relies on LoadAt's clamping, and
``reflection`` reflects each tap index as the reference does. Any number of spatial
dims works (opset 20's N-D GridSample; cubic too, though ONNX only defines it for 2-D).

AffineGrid is one statement: ``grid[n, h.., k] = sum_m theta[n, k, m] * base_m + theta[n,
k, r]`` with the base coordinates computed from the loop iterators. Col2Im is a
transposed convolution's scatter written as a gather: a reduction over the domain
``{ [n, c, y.., k.., l..] : y = l * stride - pad + k * dilation }``, whose equalities make
isl enumerate only the blocks that cover each pixel. CenterCropPad is zeros plus a copy
over an affine window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Iter, LoadAt, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers

CUBIC_A = -0.75
"""The cubic convolution coefficient GridSample uses (PyTorch's, Keys' a = -0.75)."""

MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest",
         "bicubic": "cubic", "cubic": "cubic"}  # fmt: skip
PADDING_MODES = ("zeros", "border", "reflection")


def _text(value, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _ints(ctx: LowerContext, node: Node, index: int, what: str) -> list[int]:
    return [int(v) for v in np.asarray(ctx.require_constant(node, index, what)).reshape(-1)]


def _sum(terms: list[Expr]) -> Expr:
    return reduce(lambda a, b: kb.binary("add", a, b), terms)


def _product(terms: list[Expr]) -> Expr:
    return reduce(lambda a, b: kb.binary("mul", a, b), terms)


def _all(conditions: list[Expr]) -> Expr:
    return reduce(lambda a, b: kb.binary("and", a, b), conditions)


def _f(value: float, dtype: str) -> Expr:
    return kb.const(value, dtype)


# ---- GridSample --------------------------------------------------------------------------


@lowers("GridSample")
def lower_grid_sample(ctx: LowerContext, node: Node) -> None:
    x, grid = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    where = f"GridSample node {node.name!r}"
    rank = len(x.shape) - 2
    mode = MODES.get(_text(node.attr("mode"), "linear" if node.opset >= 20 else "bilinear"))
    padding = _text(node.attr("padding_mode"), "zeros")
    align = bool(int(node.attr("align_corners", 0)))
    if mode is None:
        raise LoweringError(f"{where}: unknown mode {node.attr('mode')!r}")
    if padding not in PADDING_MODES:
        raise LoweringError(f"{where}: unknown padding_mode {padding!r}")
    if rank < 1 or grid.shape[0] != x.shape[0] or grid.shape[-1:] != (rank,):
        raise LoweringError(
            f"{where}: input {x.shape} and grid {grid.shape} do not fit: the grid must be "
            "(N, H_1, .., H_r, r) for an input (N, C, D_1, .., D_r), r >= 1"
        )
    if len(grid.shape) != rank + 2:
        raise LoweringError(f"{where}: grid {grid.shape} must have rank {rank + 2}")
    if not is_float(grid.dtype):
        raise LoweringError(f"{where}: the grid must be a float tensor, is {grid.dtype}")
    if mode != "nearest" and not is_float(x.dtype):
        raise LoweringError(f"{where}: {mode} interpolation of a {x.dtype} input")
    n, channels, sizes = x.shape[0], x.shape[1], list(x.shape[2:])
    points = list(grid.shape[1:-1])
    shape = [n, channels, *points]
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if not out.size:
        return
    if not x.size:
        raise LoweringError(f"{where}: samples an empty input {x.shape}")

    cd = "float64" if grid.dtype == "float64" else "float32"
    sampling = Sampling(x.name, x.dtype, tuple(sizes), (n, *points), padding, align, cd)
    statements = [
        _coordinates(ctx, sampling, grid.name, grid.dtype, m, mode, f"{out.name}.coord{m}")
        for m in range(rank)
    ]
    coords = [s.write.buffer for s in statements]
    if mode == "nearest":
        statements.append(_nearest(sampling, coords, out.name, shape, f"S{rank}"))
    else:
        statements += _interpolate(ctx, sampling, coords, out.name, shape, mode, rank)
    ctx.kernel(node, statements)


@dataclass(frozen=True)
class Sampling:
    """What every GridSample statement needs to know about the input and the grid."""

    x: str
    dtype: str
    sizes: tuple[int, ...]  # the input's spatial dims
    points: tuple[int, ...]  # the grid's batch and spatial dims
    padding: str
    align: bool
    cd: str  # the dtype coordinates are computed in

    @property
    def rank(self) -> int:
        return len(self.sizes)

    @property
    def borders(self) -> list[tuple[float, float]]:
        """Per dim, the coordinate range that needs no padding: the corner pixel centres
        (align_corners) or the image's outer edges."""
        return [(0.0, d - 1.0) if self.align else (-0.5, d - 0.5) for d in self.sizes]

    @property
    def grid_dims(self) -> list[str]:
        return ["n", *kb.dims("h", self.rank)]


def _coordinates(
    ctx: LowerContext, sampling: Sampling, grid: str, grid_dtype: str, m: int, mode: str, hint: str
) -> Statement:
    """``coord_m[n, h..]``: the padded source coordinate along input dim ``m`` (grid
    component ``r-1-m``: the grid lists x, y, z, i.e. the last dim first)."""
    name = f"S{m}"
    dims = sampling.grid_dims
    read = kb.access(grid, name, dims, [*dims, str(sampling.rank - 1 - m)])
    c = _denormalize(
        kb.cast(kb.load(read, grid_dtype), sampling.cd), sampling.sizes[m], sampling.align
    )
    if mode == "nearest":  # rint, then padding, as the reference does
        c = kb.unary("round", c)
    c = _pad_coordinate(c, sampling.padding, sampling.sizes[m], sampling.borders[m])
    temp = ctx.temp(hint, sampling.points, sampling.cd).name
    return Statement(
        name, kb.box(name, dims, sampling.points), kb.access(temp, name, dims, dims), c
    )


def _nearest(
    sampling: Sampling, coords: list[str], out: str, shape: list[int], name: str
) -> Statement:
    """One gather at the rounded coordinates."""
    odims = ["n", "c", *sampling.grid_dims[1:]]
    index = [
        _to_index(kb.load(kb.access(c, name, odims, sampling.grid_dims), sampling.cd), size)
        for c, size in zip(coords, sampling.sizes, strict=True)
    ]
    body = _pixel(sampling, index, sampling.dtype)
    return Statement(name, kb.box(name, odims, shape), kb.access(out, name, odims, odims), body)


def _interpolate(
    ctx: LowerContext,
    sampling: Sampling,
    coords: list[str],
    out: str,
    shape: list[int],
    mode: str,
    first: int,
) -> list[Statement]:
    """A weighted sum over the taps around each coordinate, one tap dim per spatial dim,
    accumulated in float32 (float64 for a float64 input)."""
    ad = "float64" if sampling.dtype == "float64" else "float32"
    acc = out if sampling.dtype == ad else ctx.temp(f"{out}.acc", shape, ad).name
    odims = ["n", "c", *sampling.grid_dims[1:]]
    init = f"S{first}"
    statements = [
        Statement(init, kb.box(init, odims, shape), kb.access(acc, init, odims, odims), _f(0, ad))
    ]
    name = f"S{first + 1}"
    taps, offset = (2, 0) if mode == "linear" else (4, -1)  # taps from floor + offset
    tdims = kb.dims("t", sampling.rank)
    full = [*odims, *tdims]
    index, weights = [], []
    for c_name, size, t_dim in zip(coords, sampling.sizes, tdims, strict=True):
        c = kb.load(kb.access(c_name, name, full, sampling.grid_dims), sampling.cd)
        low = kb.unary("floor", c)
        t = Iter("int64", t_dim)
        tap = kb.binary("add", t, kb.const(offset, "int64"))
        index.append(kb.binary("add", _to_index(low, size), tap))
        frac = kb.binary("sub", c, low)
        weights.append(_linear_weight(frac, t) if mode == "linear" else _cubic_weight(frac, t))
    body = kb.binary("mul", kb.cast(_product(weights), ad), _pixel(sampling, index, ad))
    domain = kb.box(name, full, [*shape, *([taps] * sampling.rank)])
    statements.append(Statement(name, domain, kb.access(acc, name, full, odims), body, "add"))
    if acc != out:
        name = f"S{first + 2}"
        value = kb.cast(kb.load(kb.access(acc, name, odims, odims), ad), sampling.dtype)
        write = kb.access(out, name, odims, odims)
        statements.append(Statement(name, kb.box(name, odims, shape), write, value))
    return statements


def _denormalize(g: Expr, size: int, align: bool) -> Expr:
    """[-1, 1] → pixel coordinates: the centres of the corner pixels (``align_corners``)
    or their outer edges."""
    one = _f(1, g.dtype)
    if align:
        return kb.binary(
            "mul", kb.binary("div", kb.binary("add", g, one), _f(2, g.dtype)), _f(size - 1, g.dtype)
        )
    scaled = kb.binary("mul", kb.binary("add", g, one), _f(size, g.dtype))
    return kb.binary("div", kb.binary("sub", scaled, one), _f(2, g.dtype))


def _pad_coordinate(c: Expr, padding: str, size: int, border: tuple[float, float]) -> Expr:
    """A coordinate outside ``border`` clamped into the image (``border``) or reflected
    back into ``border`` (``reflection``); ``zeros`` keeps it (its taps read 0)."""
    if padding == "zeros":
        return c
    lo, hi = border
    outside = kb.binary(
        "or",
        kb.binary("lt", c, _f(lo, c.dtype), "bool"),
        kb.binary("gt", c, _f(hi, c.dtype), "bool"),
    )
    if padding == "border":
        clamped = kb.binary("min", kb.binary("max", c, _f(0, c.dtype)), _f(size - 1, c.dtype))
        return kb.select(outside, clamped, c)
    return _reflect(c, lo, hi)


def _reflect(c: Expr, lo: float, hi: float) -> Expr:
    """The reference's ``_gs_reflect``: fold ``c`` back into ``[lo, hi]`` by reflecting
    at the near border as often as needed."""
    span = hi - lo
    if span <= 0:
        return _f(lo, c.dtype)
    lo_e, hi_e, span_e = _f(lo, c.dtype), _f(hi, c.dtype), _f(span, c.dtype)

    def fold(distance: Expr) -> tuple[Expr, Expr]:
        """How far into the image ``distance`` past a border ends, and whether it ends
        after an even number of reflections (nearer that border) or an odd one."""
        times = kb.unary("floor", kb.binary("div", distance, span_e))
        rest = kb.binary("sub", distance, kb.binary("mul", times, span_e))
        even = kb.binary("eq", kb.binary("fmod", times, _f(2, c.dtype)), _f(0, c.dtype), "bool")
        return rest, even

    rest, even = fold(kb.binary("sub", lo_e, c))
    below = kb.select(even, kb.binary("add", lo_e, rest), kb.binary("sub", hi_e, rest))
    rest, even = fold(kb.binary("sub", c, hi_e))
    above = kb.select(even, kb.binary("sub", hi_e, rest), kb.binary("add", lo_e, rest))
    result = kb.select(kb.binary("gt", c, hi_e, "bool"), above, c)
    return kb.select(kb.binary("lt", c, lo_e, "bool"), below, result)


def _reflect_index(i: Expr, size: int, align: bool) -> Expr:
    """An integer tap index reflected into the image, as ``_reflect`` would on its float
    value, in integer arithmetic: with period ``2 (size - 1)`` about the corner pixel
    centres (``align_corners``) or ``2 size`` about the image edges."""
    if align and size == 1:
        return kb.const(0, "int64")
    period = 2 * (size - 1) if align else 2 * size
    j = kb.binary("mod", i, kb.const(period, "int64"))  # in [0, period): the divisor's sign
    back = kb.binary("sub", kb.const(period if align else period - 1, "int64"), j)
    return kb.select(kb.binary("ge", j, kb.const(size, "int64"), "bool"), back, j)


def _to_index(c: Expr, size: int) -> Expr:
    """A float coordinate as an int64 index, truncated toward zero as ``astype(int)`` is;
    a far-away, infinite or NaN coordinate becomes an index just outside the image (so
    the float-to-int conversion never overflows)."""
    low, high = _f(-8, c.dtype), _f(size + 8, c.dtype)
    safe = kb.binary("min", kb.binary("max", c, low), high)
    return kb.cast(kb.select(kb.unary("isnan", c, "bool"), low, safe), "int64")


def _pixel(sampling: Sampling, index: list[Expr], work: str) -> Expr:
    """``x[n, c, index..]`` as ``work``: 0 outside the image for ``zeros``, the nearest
    pixel for ``border`` (LoadAt clamps), a reflected index for ``reflection``."""
    if sampling.padding == "reflection":
        index = [
            _reflect_index(i, size, sampling.align)
            for i, size in zip(index, sampling.sizes, strict=True)
        ]
    read = LoadAt(sampling.dtype, sampling.x, (Iter("int64", "n"), Iter("int64", "c"), *index))
    value = kb.cast(read, work)
    if sampling.padding != "zeros":
        return value
    inside = _all(
        [
            kb.binary(
                "and",
                kb.binary("ge", i, kb.const(0, "int64"), "bool"),
                kb.binary("lt", i, kb.const(size, "int64"), "bool"),
            )
            for i, size in zip(index, sampling.sizes, strict=True)
        ]
    )
    return kb.select(inside, value, kb.const(0, work))


def _linear_weight(frac: Expr, t: Expr) -> Expr:
    first = kb.binary("eq", t, kb.const(0, "int64"), "bool")
    return kb.select(first, kb.binary("sub", _f(1, frac.dtype), frac), frac)


def _cubic_weight(frac: Expr, t: Expr) -> Expr:
    """Keys' cubic kernel at the distance ``|frac + 1 - t|`` of tap ``t`` (taps sit at
    floor - 1 .. floor + 2): ``((a+2)s - (a+3)) s² + 1`` within 1, ``((a s - 5a) s + 8a) s
    - 4a`` from 1 to 2."""
    d, a = frac.dtype, CUBIC_A
    s = kb.unary("abs", kb.binary("sub", kb.binary("add", frac, _f(1, d)), kb.cast(t, d)))
    near = _horner(s, [a + 2, -(a + 3), 0.0, 1.0])
    far = _horner(s, [a, -5 * a, 8 * a, -4 * a])
    return kb.select(kb.binary("le", s, _f(1, d), "bool"), near, far)


def _horner(s: Expr, coefficients: list[float]) -> Expr:
    """The polynomial with ``coefficients`` (highest degree first) at ``s``."""
    value = _f(coefficients[0], s.dtype)
    for c in coefficients[1:]:
        value = kb.binary("add", kb.binary("mul", value, s), _f(c, s.dtype))
    return value


# ---- AffineGrid ---------------------------------------------------------------------------


@lowers("AffineGrid")
def lower_affine_grid(ctx: LowerContext, node: Node) -> None:
    theta = ctx.buffer(node.inputs[0])
    where = f"AffineGrid node {node.name!r}"
    size = _ints(ctx, node, 1, "size")
    rank = len(size) - 2
    if rank not in (2, 3) or theta.shape != (size[0], rank, rank + 1):
        raise LoweringError(
            f"{where}: size {size} needs theta of shape (N, 2, 3) or (N, 3, 4), got {theta.shape}"
        )
    if not is_float(theta.dtype):
        raise LoweringError(f"{where}: theta must be a float tensor, is {theta.dtype}")
    align = bool(int(node.attr("align_corners", 0)))
    points = size[2:]
    shape = [size[0], *points, rank]
    out = ctx.output(node.outputs[0], shape, theta.dtype)
    if not out.size:
        return
    dims = ["n", *kb.dims("h", rank), "k"]
    work = "float64"
    terms = []
    for m in range(rank):  # component m runs along spatial dim rank-1-m (x = width)
        length = points[rank - 1 - m]
        if align:
            start, step = -1.0, (2.0 / (length - 1) if length > 1 else 0.0)
        else:
            step = 2.0 / length
            start = -1.0 + step / 2
        position = kb.cast(Iter("int64", dims[rank - m]), work)
        base = kb.binary("add", _f(start, work), kb.binary("mul", position, _f(step, work)))
        coefficient = kb.cast(
            kb.load(kb.access(theta.name, "S0", dims, ["n", "k", str(m)]), theta.dtype), work
        )
        terms.append(kb.binary("mul", coefficient, base))
    terms.append(
        kb.cast(
            kb.load(kb.access(theta.name, "S0", dims, ["n", "k", str(rank)]), theta.dtype), work
        )
    )
    body = kb.cast(_sum(terms), theta.dtype)
    ctx.kernel(
        node,
        [Statement("S0", kb.box("S0", dims, shape), kb.access(out.name, "S0", dims, dims), body)],
    )


# ---- Col2Im ---------------------------------------------------------------------------------


@lowers("Col2Im")
def lower_col2im(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    where = f"Col2Im node {node.name!r}"
    image = _ints(ctx, node, 1, "image_shape")
    block = _ints(ctx, node, 2, "block_shape")
    rank = len(image)
    dilations = list(node.attr("dilations", ()) or [1] * rank)
    strides = list(node.attr("strides", ()) or [1] * rank)
    pads = list(node.attr("pads", ()) or [0] * (2 * rank))
    if (
        len(x.shape) != 3
        or len(block) != rank
        or len(dilations) != rank
        or len(strides) != rank
        or len(pads) != 2 * rank
    ):
        raise LoweringError(
            f"{where}: input {x.shape}, image_shape {image}, block_shape {block}, dilations "
            f"{dilations}, strides {strides} and pads {pads} do not agree"
        )
    kernel = math.prod(block)
    blocks = [
        (image[d] + pads[d] + pads[rank + d] - (dilations[d] * (block[d] - 1) + 1)) // strides[d]
        + 1
        for d in range(rank)
    ]
    if kernel <= 0 or x.shape[1] % kernel or x.shape[2] != math.prod(blocks) or min(blocks) < 1:
        raise LoweringError(
            f"{where}: input {x.shape} does not hold {kernel}-element blocks for "
            f"{blocks} block positions (image {image}, block {block})"
        )
    channels = x.shape[1] // kernel
    shape = [x.shape[0], channels, *image]
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if not out.size:
        return
    ydims, kdims, ldims = kb.dims("y", rank), kb.dims("k", rank), kb.dims("l", rank)
    odims = ["n", "c", *ydims]
    init = Statement(
        "S0",
        kb.box("S0", odims, shape),
        kb.access(out.name, "S0", odims, odims),
        kb.const(0, x.dtype),
    )
    full = [*odims, *kdims, *ldims]
    bounds = [f"0 <= {d} < {s}" for d, s in zip(full, [*shape, *block, *blocks], strict=True)]
    bounds += [
        f"{ydims[d]} = {strides[d]}*{ldims[d]} - {pads[d]} + {dilations[d]}*{kdims[d]}"
        for d in range(rank)
    ]
    domain = f"{{ S1[{', '.join(full)}] : {' and '.join(bounds)} }}"
    channel = " + ".join(
        [f"{kernel}*c", *(f"{math.prod(block[d + 1 :])}*{kdims[d]}" for d in range(rank))]
    )
    column = " + ".join(f"{math.prod(blocks[d + 1 :])}*{ldims[d]}" for d in range(rank))
    body = kb.load(kb.access(x.name, "S1", full, ["n", channel, column]), x.dtype)
    update = Statement("S1", domain, kb.access(out.name, "S1", full, odims), body, "add")
    ctx.kernel(node, [init, update])


# ---- CenterCropPad ----------------------------------------------------------------------------


@lowers("CenterCropPad")
def lower_center_crop_pad(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    where = f"CenterCropPad node {node.name!r}"
    rank = len(x.shape)
    target = _ints(ctx, node, 1, "shape")
    axes_attr = node.attr("axes")
    axes = list(range(rank))
    if axes_attr is not None:  # in the given order, which pairs them with the sizes
        axes = [kb.normalize_axis(a, rank, where) for a in axes_attr]
        if len(set(axes)) != len(axes):
            raise LoweringError(f"{where}: axes {list(axes_attr)} name an axis twice")
    if len(target) != len(axes) or min(target, default=0) < 0:
        raise LoweringError(f"{where}: shape {target} does not give one size per axis {axes}")
    shape = list(x.shape)
    offset = [0] * rank  # out index + offset = input index
    window = [(0, n) for n in x.shape]  # the output range that reads the input
    for a, size in zip(axes, target, strict=True):
        dim = x.shape[a]
        shape[a] = size
        if size < dim:
            offset[a] = (dim - size) // 2
            window[a] = (0, size)
        elif size > dim:
            start = (size - dim) // 2
            offset[a] = -start
            window[a] = (start, start + dim)
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if not out.size:
        return
    dims = kb.dims("d", rank)
    statements = []
    if any(w != (0, n) for w, n in zip(window, shape, strict=True)):
        statements.append(
            Statement(
                "S0",
                kb.box("S0", dims, shape),
                kb.access(out.name, "S0", dims, dims),
                kb.const(0, x.dtype),
            )
        )
    if all(hi > lo for lo, hi in window):
        name = f"S{len(statements)}"
        bounds = " and ".join(
            f"{lo} <= {d} < {hi}" for d, (lo, hi) in zip(dims, window, strict=True)
        )
        domain = f"{{ {name}[{', '.join(dims)}] : {bounds} }}" if dims else f"{{ {name}[] }}"
        read = [
            f"{d} + {o}" if o >= 0 else f"{d} - {-o}" for d, o in zip(dims, offset, strict=True)
        ]
        body = kb.load(kb.access(x.name, name, dims, read), x.dtype)
        statements.append(Statement(name, domain, kb.access(out.name, name, dims, dims), body))
    if statements:
        ctx.kernel(node, statements)
