"""Resize (opsets 10-19) and Upsample (7, 9): nearest, linear and cubic interpolation.

Interpolation is separable, and for each resized axis everything that depends on the
output position alone — the source coordinate (coordinate_transformation_mode), the
source indices of its taps (clamped into the input, as ONNX's edge padding says) and
their weights (linear, cubic, antialiased filters, exclude_outside) — is fixed once the
shapes and scales are. So it is computed here, in float64 exactly as the ONNX reference
does, into small per-axis tables of shape ``(taps, out)``, and the kernel reads::

    nearest   out[y] = x[index_0[y_0], ..., index_k[y_k]]          one statement, all axes
    filters   t1[y]  = sum_t w_a[t, y_a] * x[..., index_a[t, y_a], ...]   one pass per axis

(a LoadAt at table-loaded indices; axes that keep their size and coordinates are read at
the output index itself). Passes run in axis order through float temps, as the reference
does, which also gives tf_crop_and_resize its per-axis extrapolation: each pass computes
only the output range whose source coordinate lies inside the input and fills the rest
with ``extrapolation_value``.

Opset < 11 (Resize-10, Upsample) maps coordinates with ``y / scale`` and picks the nearest
pixel by truncation (by ceiling when downsampling), as onnxruntime does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.frontend.validate import COORDINATE_MODES, NEAREST_MODES
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Expr, Iter, LoadAt, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers

MODES = ("nearest", "linear", "cubic")
LEGACY = "legacy"
"""The nearest pixel of opset < 11: truncate, or take the ceiling when downsampling."""


@dataclass(frozen=True)
class Settings:
    mode: str
    coordinates: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    extrapolation: float
    antialias: bool


@dataclass(frozen=True)
class Axis:
    """How one axis is resized: its output size, the tap indices and weights as
    ``(taps, out)`` tables, and the output range ``[lo, hi)`` computed from the input
    (the rest is extrapolated). ``index is None``: the axis is copied unchanged."""

    size: int
    index: np.ndarray | None = None
    weight: np.ndarray | None = None
    inside: tuple[int, int] = (0, 0)


@lowers("Resize", "Upsample")
def lower_resize(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    settings = _settings(node)
    scales, sizes, roi = _geometry(ctx, node, x.shape, settings)
    axes = [
        _axis(settings, n, s, m, r) for n, s, m, r in zip(x.shape, scales, sizes, roi, strict=True)
    ]
    shape = [a.size for a in axes]
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if not out.size or not x.size:
        if out.size:
            raise LoweringError(f"{node.op_type} node {node.name!r}: resizes an empty input")
        return
    resized = [r for r, a in enumerate(axes) if a.index is not None]
    if not resized:
        ctx.kernel(node, [_copy(out.name, x.name, x.dtype, shape)])
        return
    if settings.mode == "nearest":
        ctx.kernel(node, _nearest(ctx, out, x, axes, settings))
    else:
        ctx.kernel(node, _filters(ctx, out, x, axes, resized, settings))


# ---- reading the node ------------------------------------------------------------------


def _text(value, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _settings(node: Node) -> Settings:
    legacy = node.op_type == "Upsample" or node.opset < 11
    mode = _text(node.attr("mode"), "nearest")
    if legacy and mode == "bilinear":
        mode = "linear"
    coordinates = (
        "asymmetric" if legacy else _text(node.attr("coordinate_transformation_mode"), "half_pixel")
    )
    nearest = LEGACY if legacy else _text(node.attr("nearest_mode"), "round_prefer_floor")
    settings = Settings(
        mode=mode,
        coordinates=coordinates,
        nearest=nearest,
        cubic_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(int(node.attr("exclude_outside", 0))),
        extrapolation=float(node.attr("extrapolation_value", 0.0)),
        antialias=bool(int(node.attr("antialias", 0))),
    )
    where = f"{node.op_type} node {node.name!r}"
    if mode not in (("nearest", "linear") if legacy else MODES):
        raise LoweringError(f"{where}: unknown mode {mode!r}")
    if coordinates not in COORDINATE_MODES:
        raise LoweringError(f"{where}: unknown coordinate_transformation_mode {coordinates!r}")
    if nearest not in (*NEAREST_MODES, LEGACY):
        raise LoweringError(f"{where}: unknown nearest_mode {nearest!r}")
    if settings.antialias and mode == "nearest":
        raise LoweringError(f"{where}: antialias is not defined for nearest mode")
    return settings


def _floats(ctx: LowerContext, node: Node, index: int, what: str) -> np.ndarray | None:
    """A float input needed at compile time, or None when absent or empty."""
    if not node.input(index):
        return None
    value = np.asarray(ctx.require_constant(node, index, what)).reshape(-1)
    return value if value.size else None


def _geometry(ctx: LowerContext, node: Node, shape: tuple[int, ...], settings: Settings):
    """Per axis: the scale factor (float), the output size and the roi (start, end)."""
    rank = len(shape)
    where = f"{node.op_type} node {node.name!r}"
    if node.op_type == "Upsample" and node.opset < 9:
        scales, sizes, roi = np.asarray(node.attr("scales", ()), np.float32), None, None
    elif node.op_type == "Upsample" or node.opset < 11:
        scales, sizes, roi = _floats(ctx, node, 1, "scales"), None, None
    else:
        scales = _floats(ctx, node, 2, "scales")
        sizes = _floats(ctx, node, 3, "sizes")
        roi = None
        if settings.coordinates == "tf_crop_and_resize":
            roi = _floats(ctx, node, 1, "roi")
            if roi is None:
                raise LoweringError(f"{where}: tf_crop_and_resize needs an roi input")
    if (scales is None) == (sizes is None):
        raise LoweringError(f"{where}: exactly one of scales and sizes must be given")
    axes = list(range(rank))
    if node.opset >= 18 and node.attr("axes") is not None:
        axes = [int(a) for a in node.attr("axes")]
        if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) < len(axes):
            raise LoweringError(f"{where}: bad axes {axes} for rank {rank}")
        axes = [a % rank for a in axes]
    given = scales if scales is not None else sizes
    if len(given) != len(axes) or (roi is not None and len(roi) != 2 * len(axes)):
        raise LoweringError(
            f"{where}: {len(given)} scales/sizes (and roi of {0 if roi is None else len(roi)}) "
            f"for {len(axes)} axes"
        )
    full_roi: list[tuple | None] = [None] * rank
    if roi is not None:
        for i, a in enumerate(axes):
            full_roi[a] = (roi[i], roi[len(axes) + i])
    if scales is not None:
        factor = [1.0] * rank
        for i, a in enumerate(axes):
            factor[a] = float(scales[i])
        if min(factor) <= 0:
            raise LoweringError(f"{where}: scales must be positive, got {list(scales)}")
        return factor, [int(f * n) for f, n in zip(factor, shape, strict=True)], full_roi
    out = list(shape)
    for i, a in enumerate(axes):
        out[a] = int(sizes[i])
    factor = [o / n if n else 1.0 for o, n in zip(out, shape, strict=True)]
    policy = (
        _text(node.attr("keep_aspect_ratio_policy"), "stretch") if node.opset >= 18 else "stretch"
    )
    if policy == "stretch":
        return factor, out, full_roi
    if policy not in ("not_larger", "not_smaller"):
        raise LoweringError(f"{where}: unknown keep_aspect_ratio_policy {policy!r}")
    pick = min if policy == "not_larger" else max
    scale = pick(factor[a] for a in axes)
    factor = [scale if r in axes else 1.0 for r in range(rank)]
    out = [int(scale * n + 0.5) if r in axes else n for r, n in enumerate(shape)]
    return factor, out, full_roi


# ---- per-axis tables ---------------------------------------------------------------------


def _axis(settings: Settings, n: int, scale: float, size: int, roi: tuple | None) -> Axis:
    """The tables of one axis, following onnx.reference's Resize (_interpolate_1d_along_axis)."""
    trivial_roi = roi is None or (
        math.isclose(float(roi[0]), 0.0) and math.isclose(float(roi[1]), 1.0)
    )
    if math.isclose(scale, 1.0) and size == n and trivial_roi:
        return Axis(size)
    if size == 0 or n == 0:
        return Axis(size, np.zeros((1, size), np.int64), None, (0, size))
    _check_table(settings, size, scale)
    x, inside = _source_coordinates(settings.coordinates, size, scale, n, roi)
    rows = np.flatnonzero(inside)
    span = (int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 0)
    if rows.size and rows.size != span[1] - span[0]:
        raise LoweringError(f"tf_crop_and_resize: the in-range outputs {rows} are not contiguous")
    if settings.nearest == LEGACY and settings.mode == "nearest":
        pick = np.ceil(x) if scale < 1 else np.trunc(x)
        return Axis(size, np.clip(pick, 0, n - 1).astype(np.int64)[None, :], None, span)
    whole = x == np.floor(x)
    ratio = np.where(whole, 1.0, x - np.floor(x))
    coeffs = _coefficients(settings, ratio.astype(np.float64), scale)
    taps = coeffs.shape[1]
    pad = math.ceil(taps / 2)
    padded = x + pad
    base = np.floor(padded)
    frac = padded - base
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        first = -((taps - 1) // 2)
        offset = np.where(frac <= 0.5, first, first + 1)
    index = (base + offset - pad).astype(np.int64)[:, None] + np.arange(taps)[None, :]
    if settings.exclude_outside:
        coeffs = np.where((index < 0) | (index >= n), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, n - 1)
    if settings.mode == "nearest":
        chosen = np.argmax(coeffs, axis=1)
        return Axis(size, index[np.arange(size), chosen][None, :], None, span)
    return Axis(size, np.ascontiguousarray(index.T), np.ascontiguousarray(coeffs.T), span)


def _source_coordinates(mode: str, size: int, scale: float, n: int, roi: tuple | None):
    """Each output index's coordinate in the input, and whether it lies inside it
    (always, except for tf_crop_and_resize)."""
    y = np.arange(size, dtype=np.float64)
    width = scale * n
    inside = np.ones(size, bool)
    if mode == "align_corners":
        x = np.zeros(size) if width == 1 else y * (n - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    elif mode == "pytorch_half_pixel":
        x = np.full(size, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = n / 2 * (1 - size / width)
        x = offset + (y + 0.5) / scale - 0.5
    else:  # tf_crop_and_resize
        start, end = roi if roi is not None else (np.float32(0), np.float32(1))
        if width == 1:
            x = np.full(size, (end - start) * (n - 1) / 2, dtype=np.float64)
        else:
            x = y * (end - start) * (n - 1) / (width - 1)
        x = x + start * (n - 1)
        inside = (x >= 0) & (x <= n - 1)
    return x, inside


MAX_TABLE_ENTRIES = 1 << 24
"""The most entries (output positions x taps) one axis's tables may hold: 128 MiB of int64
indices and as much of float64 weights. Outputs within the load budget (docs/limits.md)
that need more, a [1, 1, 2**31, 1] output or an antialiased shrink by 1e-6, are refused."""


def _taps(settings: Settings, scale: float) -> int:
    """How many taps each output position of an axis reads (the tables' height)."""
    if settings.mode == "nearest" or (settings.mode == "linear" and not settings.antialias):
        return 2
    if not settings.antialias:
        return 4
    reach = 1 if settings.mode == "linear" else 2
    start = math.floor(-reach / min(scale, 1.0)) + 1
    return 2 - 2 * start


def _check_table(settings: Settings, size: int, scale: float) -> None:
    entries = size * _taps(settings, scale)
    if entries > MAX_TABLE_ENTRIES:
        raise LoweringError(
            f"Resize: an axis resized to {size} (scale {scale}) needs a table of {entries} "
            f"entries, over the limit of {MAX_TABLE_ENTRIES} (resize.MAX_TABLE_ENTRIES)"
        )


def _coefficients(settings: Settings, ratio: np.ndarray, scale: float) -> np.ndarray:
    """The filter taps, one row per output position, for source coordinates ``ratio``
    past their left neighbours (vectorised over the positions)."""
    r = ratio[:, None]
    if settings.mode == "nearest":
        up = {
            "round_prefer_floor": ratio > 0.5,
            "round_prefer_ceil": ratio >= 0.5,
            "floor": np.zeros(ratio.shape, bool),
            "ceil": np.ones(ratio.shape, bool),
        }[settings.nearest] | (ratio == 1.0)
        return np.stack([np.where(up, 0.0, 1.0), np.where(up, 1.0, 0.0)], axis=1)
    if settings.mode == "linear":
        if not settings.antialias:
            return np.concatenate([1 - r, r], axis=1)
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        args = (np.arange(start, 2 - start)[None, :] - r) * s
        coeffs = np.clip(1 - np.abs(args), 0, 1)
        return coeffs / coeffs.sum(axis=1, keepdims=True)
    a = settings.cubic_a
    if not settings.antialias:
        q = 1 - r
        return np.concatenate(
            [
                ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                ((a + 2) * r - (a + 3)) * r * r + 1,
                ((a + 2) * q - (a + 3)) * q * q + 1,
                ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a,
            ],
            axis=1,
        )
    s = min(scale, 1.0)
    start = int(np.floor(-2 / s) + 1)
    args = np.abs(s * (np.arange(start, 2 - start)[None, :] - r))
    near = ((a + 2) * args - (a + 3)) * args * args + 1
    far = ((a * args - 5 * a) * args + 8 * a) * args - 4 * a
    coeffs = np.where(args <= 1, near, np.where(args < 2, far, 0.0))
    return coeffs / coeffs.sum(axis=1, keepdims=True)


# ---- statements --------------------------------------------------------------------------


def _copy(out: str, src: str, dtype: str, shape: list[int]) -> Statement:
    dims = kb.dims("d", len(shape))
    body = kb.load(kb.access(src, "S0", dims, dims), dtype)
    return Statement("S0", kb.box("S0", dims, shape), kb.access(out, "S0", dims, dims), body)


def _domain(name: str, dims: list[str], ranges: list[tuple[int, int]]) -> str:
    bounds = " and ".join(f"{lo} <= {d} < {hi}" for d, (lo, hi) in zip(dims, ranges, strict=True))
    return f"{{ {name}[{', '.join(dims)}] : {bounds} }}"


def _nearest(ctx: LowerContext, out: Buffer, x: Buffer, axes: list[Axis], settings: Settings):
    """One gather over the output; extrapolated rows (tf_crop_and_resize) are filled first."""
    dims = kb.dims("d", len(axes))
    statements = _extrapolate(out, dims, axes, range(len(axes)), settings, [])
    name = f"S{len(statements)}"
    index: list[Expr] = []
    for r, (d, axis) in enumerate(zip(dims, axes, strict=True)):
        if axis.index is None:
            index.append(Iter("int64", d))
            continue
        table = ctx.table(f"{out.name}.index{r}", axis.index).name
        index.append(kb.load(kb.access(table, name, dims, ["0", d]), "int64"))
    ranges = [a.inside if a.index is not None else (0, a.size) for a in axes]
    if all(hi > lo for lo, hi in ranges):
        body = LoadAt(x.dtype, x.name, tuple(index))
        write = kb.access(out.name, name, dims, dims)
        statements.append(Statement(name, _domain(name, dims, ranges), write, body))
    return statements


def _filters(ctx, out: Buffer, x: Buffer, axes: list[Axis], resized: list[int], settings):
    """One weighted-sum pass per resized axis, in axis order, through float temps."""
    if x.dtype == "bool":
        raise LoweringError(f"Resize of {x.name!r}: {settings.mode} mode on a bool tensor")
    # integers are rounded at the end: float64, as the reference, so that halves agree
    work = "float32" if x.dtype in ("float16", "float32") else "float64"
    dims = kb.dims("d", len(axes))
    shape = list(x.shape)
    statements: list[Statement] = []
    src = x
    for step, r in enumerate(resized):
        axis = axes[r]
        shape[r] = axis.size
        last = step == len(resized) - 1
        dst = out if last else ctx.temp(f"{out.name}.pass{r}", shape, work)
        statements += _extrapolate(dst, dims, axes, [r], settings, statements)
        name = f"S{len(statements)}"
        index_table = ctx.table(f"{out.name}.index{r}", axis.index).name
        weight_table = ctx.table(f"{out.name}.weight{r}", axis.weight.astype(work)).name
        total: Expr | None = None
        for tap in range(axis.index.shape[0]):
            at = [str(tap), dims[r]]
            index = [Iter("int64", d) for d in dims]
            index[r] = kb.load(kb.access(index_table, name, dims, at), "int64")
            value = kb.cast(LoadAt(src.dtype, src.name, tuple(index)), work)
            term = kb.binary("mul", kb.load(kb.access(weight_table, name, dims, at), work), value)
            total = term if total is None else kb.binary("add", total, term)
        ranges = [(0, n) for n in shape]
        ranges[r] = axis.inside
        if ranges[r][1] > ranges[r][0]:
            body = _finish(total, dst.dtype) if last else total
            write = kb.access(dst.name, name, dims, dims)
            statements.append(Statement(name, _domain(name, dims, ranges), write, body))
        src = dst
    return statements


def _finish(value: Expr, dtype: str) -> Expr:
    """The float result as ``dtype``: integers are rounded (half to even) and saturated."""
    if is_float(dtype):
        return kb.cast(value, dtype)
    info = np.iinfo(np.dtype(dtype))
    top = float(info.max)
    if top > info.max:  # (u)int64: the nearest double is 2**63 (2**64), out of range
        top = float(np.nextafter(top, 0.0))
    value = kb.unary("round", value)
    value = kb.binary("max", value, kb.const(float(info.min), value.dtype))
    value = kb.binary("min", value, kb.const(top, value.dtype))
    return kb.cast(value, dtype)


def _extrapolate(dst: Buffer, dims, axes: list[Axis], which, settings, before) -> list[Statement]:
    """Fill the output slabs along ``which`` whose source lies outside the input."""
    fill = _saturate(settings.extrapolation, dst.dtype)
    statements: list[Statement] = []
    shape = list(dst.shape)
    for r in which:
        axis = axes[r]
        if axis.index is None:
            continue
        for lo, hi in ((0, axis.inside[0]), (axis.inside[1], axis.size)):
            if hi <= lo:
                continue
            name = f"S{len(before) + len(statements)}"
            ranges = [(0, n) for n in shape]
            ranges[r] = (lo, hi)
            write = kb.access(dst.name, name, dims, dims)
            statements.append(
                Statement(name, _domain(name, dims, ranges), write, kb.const(fill, dst.dtype))
            )
    return statements


def _saturate(value: float, dtype: str) -> float | int | bool:
    if is_float(dtype) or dtype == "bool":
        return value
    info = np.iinfo(np.dtype(dtype))
    return int(np.clip(np.round(value), info.min, info.max))
