"""Signal processing: HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix, DFT, STFT.

The windows are one statement over ``n < size``: a cosine series of the angle
``2π n / N`` computed from the iterator in float64 (``N = size``, or ``size - 1`` when
``periodic=0``), rounded once to ``output_datatype``.

MelWeightMatrix's triangle corners depend only on its scalar inputs, so they are computed
at compile time exactly as the reference does (a table of ``num_mel_bins + 2`` FFT bin
indices); the matrix is then one statement of piecewise-linear ramps between
consecutive corners, read from the table with affine accesses.

DFT is the O(n²) contraction, not an FFT. A twiddle table ``cos/sin(2π m / n)``, ``m <
n``, is computed in float64 first (the angle from the iterator, reduced to ``[-π, π]``),
and the transform reads it at ``(f * t) mod n`` (a LoadAt), so every angle is exact
before its cosine is taken, however long the signal::

    S0: cos_n[m] = cos(2π m' / n)       S1: sin_n[m] = sin(2π m' / n)
    S2: acc[.., f, .., q] = 0
    S3: acc[.., f, .., 0] += x_re[.., t, ..] cos_n[f t mod n] + x_im[.., t, ..] sin_n[f t mod n]
    S4: acc[.., f, .., 1] += x_im[.., t, ..] cos_n[f t mod n] - x_re[.., t, ..] sin_n[f t mod n]
    S5: y = acc (/ n for the inverse), rounded to the input type

(signs flipped for the inverse). Sums run in float64, as the reference's ``np.fft``
does. A real input is a trailing dim of 1, a complex one a trailing dim of 2;
``onesided`` keeps the first ``n // 2 + 1`` bins, and ``inverse`` with ``onesided`` is
the inverse real transform (Hermitian input, real output of trailing dim 1). STFT is
the same contraction over frames: ``x[b, frame * step + t] * window[t]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Expr, Iter, LoadAt, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.constant import constant_scalar
from polyonnx.krnl.ops.elementwise import ONNX_DTYPES

WORK = "float64"

# window → (a_0, a_1, a_2): w[n] = a_0 - a_1 cos(2π n / N) + a_2 cos(4π n / N)
WINDOWS = {
    "HannWindow": (0.5, 0.5, 0.0),
    "HammingWindow": (25.0 / 46.0, 21.0 / 46.0, 0.0),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}


def _output_dtype(node: Node) -> str:
    code = int(node.attr("output_datatype", 1))
    dtype = ONNX_DTYPES.get(code)
    if dtype is None or dtype == "bool":
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: unsupported output_datatype {code}"
        )
    return dtype


def _f(value: float) -> Expr:
    return kb.const(value, WORK)


def _i64(value: int) -> Expr:
    return kb.const(value, "int64")


def _finish(value: Expr, dtype: str) -> Expr:
    """A float64 result as ``dtype``; integers truncate, and NaN becomes 0 (a float to
    int conversion of NaN would be undefined)."""
    if is_float(dtype):
        return kb.cast(value, dtype)
    info = np.iinfo(np.dtype(dtype))
    value = kb.select(kb.unary("isnan", value, "bool"), _f(0), value)
    value = kb.binary("min", kb.binary("max", value, _f(float(info.min))), _f(float(info.max)))
    return kb.cast(value, dtype)


# ---- windows --------------------------------------------------------------------------------


@lowers(*WINDOWS)
def lower_window(ctx: LowerContext, node: Node) -> None:
    size = int(constant_scalar(ctx, node, 0, "size"))
    dtype = _output_dtype(node)
    if size < 0:
        raise LoweringError(f"{node.op_type} node {node.name!r}: size {size} is negative")
    out = ctx.output(node.outputs[0], [size], dtype)
    if not size:
        return
    period = size if int(node.attr("periodic", 1)) else size - 1
    a0, a1, a2 = WINDOWS[node.op_type]
    step = 2 * math.pi / period if period else math.nan  # size 1, symmetric: 0/0, as numpy
    angle = kb.binary("mul", kb.cast(Iter("int64", "i"), WORK), _f(step))
    if node.op_type == "HannWindow":  # the reference's sin²(π n / N)
        half = kb.unary("sin", kb.binary("mul", angle, _f(0.5)))
        value = kb.binary("mul", half, half)
    else:
        value = kb.binary("sub", _f(a0), kb.binary("mul", _f(a1), kb.unary("cos", angle)))
        if a2:
            twice = kb.unary("cos", kb.binary("mul", angle, _f(2)))
            value = kb.binary("add", value, kb.binary("mul", _f(a2), twice))
    write = kb.access(out.name, "S0", ["i"], ["i"])
    body = _finish(value, dtype)
    ctx.kernel(node, [Statement("S0", kb.box("S0", ["i"], [size]), write, body)])


# ---- MelWeightMatrix --------------------------------------------------------------------------


@lowers("MelWeightMatrix")
def lower_mel_weight_matrix(ctx: LowerContext, node: Node) -> None:
    where = f"MelWeightMatrix node {node.name!r}"
    mel_bins = constant_scalar(ctx, node, 0, "num_mel_bins")
    dft_length = constant_scalar(ctx, node, 1, "dft_length")
    sample_rate = constant_scalar(ctx, node, 2, "sample_rate")
    lower = constant_scalar(ctx, node, 3, "lower_edge_hertz")
    upper = constant_scalar(ctx, node, 4, "upper_edge_hertz")
    dtype = _output_dtype(node)
    if int(mel_bins) < 0 or int(dft_length) < 0 or int(sample_rate) <= 0:
        raise LoweringError(
            f"{where}: num_mel_bins {mel_bins}, dft_length {dft_length} and sample_rate "
            f"{sample_rate} must be non-negative (sample_rate positive)"
        )
    corners = _mel_corners(mel_bins, dft_length, sample_rate, lower, upper)
    spectrum = int(dft_length) // 2 + 1
    shape = [spectrum, int(mel_bins)]
    out = ctx.output(node.outputs[0], shape, dtype)
    if not out.size:
        return
    if corners.min() < 0 or corners.max() > spectrum:
        raise LoweringError(
            f"{where}: the triangle corners {corners.tolist()} fall outside the {spectrum} "
            "spectrogram bins (check the edge frequencies against sample_rate)"
        )
    table = ctx.table(f"{out.name}.corners", corners).name
    dims = ["j", "i"]

    def corner(offset: int) -> Expr:
        index = "i" if not offset else f"i + {offset}"
        return kb.cast(kb.load(kb.access(table, "S0", dims, [index]), "int64"), WORK)

    lo, mid, hi = corner(0), corner(1), corner(2)
    j = kb.cast(Iter("int64", "j"), WORK)
    rising = kb.binary("div", kb.binary("sub", j, lo), kb.binary("sub", mid, lo))
    in_rise = kb.binary("and", kb.binary("ge", j, lo, "bool"), kb.binary("le", j, mid, "bool"))
    rise = kb.select(in_rise, rising, _f(0))
    point = kb.select(kb.binary("eq", j, mid, "bool"), _f(1), _f(0))
    up = kb.select(kb.binary("eq", mid, lo, "bool"), point, rise)
    falling = kb.binary("div", kb.binary("sub", hi, j), kb.binary("sub", hi, mid))
    in_fall = kb.binary("and", kb.binary("ge", j, mid, "bool"), kb.binary("lt", j, hi, "bool"))
    value = kb.select(in_fall, falling, up)  # the falling edge is written last
    write = kb.access(out.name, "S0", dims, dims)
    body = _finish(value, dtype)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, shape), write, body)])


def _mel_corners(mel_bins, dft_length, sample_rate, lower, upper) -> np.ndarray:
    """The FFT bins of the triangles' corners, computed as the reference does."""
    bins = np.arange(0, mel_bins + 2)
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    mel_step = (high_mel - low_mel) / bins.shape[0]
    hertz = 700 * np.expm1((bins * mel_step + low_mel) / 2595 * np.log(10))
    return (((dft_length + 1) * hertz) // sample_rate).astype(np.int64)


# ---- DFT and STFT -----------------------------------------------------------------------------


def _twiddles(ctx: LowerContext, hint: str, n: int) -> tuple[list[Statement], str, str]:
    """``cos(2π m / n)`` and ``sin(2π m / n)`` for ``m < n``, the angle reduced to
    ``[-π, π]`` from the integer ``m`` first."""
    cos_n = ctx.temp(f"{hint}.cos", [n], WORK).name
    sin_n = ctx.temp(f"{hint}.sin", [n], WORK).name
    m = Iter("int64", "m")
    wrapped = kb.select(kb.binary("gt", kb.binary("mul", m, _i64(2)), _i64(n), "bool"),
                        kb.binary("sub", m, _i64(n)), m)  # fmt: skip
    angle = kb.binary("mul", kb.cast(wrapped, WORK), _f(2 * math.pi / n))
    statements = [
        Statement(
            name,
            kb.box(name, ["m"], [n]),
            kb.access(table, name, ["m"], ["m"]),
            kb.unary(fn, angle),
        )
        for name, table, fn in (("S0", cos_n, "cos"), ("S1", sin_n, "sin"))
    ]
    return statements, cos_n, sin_n


def _contraction(
    ctx: LowerContext,
    out: Buffer,
    dims: list[str],
    freq: str,
    time_bound: int,
    read: Callable[[str, list[str], int], Expr | None],
    inverse: bool,
    n: int,
    real_output: bool = False,
) -> list[Statement]:
    """The statements of ``out[dims.., q] = sum_t x(t) e^(∓2πi freq t / n)``.

    ``read(stmt, domain_dims, q)`` is component ``q`` (0 real, 1 imaginary) of the
    signal at time ``t`` (a float64 Expr, or None for the imaginary part of a real
    signal). ``real_output``: the inverse real transform, which weighs the bins of a
    one-sided (Hermitian) spectrum and keeps the real part only.
    """
    statements, cos_n, sin_n = _twiddles(ctx, out.name, n)
    shape = list(out.shape)
    acc = ctx.temp(f"{out.name}.acc", shape, WORK).name
    odims = [*dims, "q"]
    name = f"S{len(statements)}"
    statements.append(
        Statement(name, kb.box(name, odims, shape), kb.access(acc, name, odims, odims), _f(0))
    )
    full = [*dims, "t"]
    parts = (0,) if real_output else (0, 1)
    for q in parts:
        name = f"S{len(statements)}"
        at = kb.binary("mod", kb.binary("mul", Iter("int64", freq), Iter("int64", "t")), _i64(n))
        c = LoadAt(WORK, cos_n, (at,))
        s = LoadAt(WORK, sin_n, (at,))
        body = _term(q, read(name, full, 0), read(name, full, 1), c, s, inverse)
        if real_output:  # bins 0 < k < n/2 stand for themselves and their mirror n - k
            k = Iter("int64", "t")
            single = kb.binary(
                "or",
                kb.binary("eq", k, _i64(0), "bool"),
                kb.binary("eq", kb.binary("mul", k, _i64(2)), _i64(n), "bool"),
            )
            body = kb.binary("mul", kb.select(single, _f(1), _f(2)), body)
        bounds = [f"0 <= {d} < {size}" for d, size in zip(dims, shape[:-1], strict=True)]
        bounds.append(f"0 <= t < {time_bound}")
        domain = f"{{ {name}[{', '.join(full)}] : {' and '.join(bounds)} }}"
        write = kb.access(acc, name, full, [*dims, str(q)])
        statements.append(Statement(name, domain, write, body, "add"))
    name = f"S{len(statements)}"
    result = kb.load(kb.access(acc, name, odims, odims), WORK)
    if inverse:
        result = kb.binary("mul", result, _f(1.0 / n))
    write = kb.access(out.name, name, odims, odims)
    statements.append(
        Statement(name, kb.box(name, odims, shape), write, kb.cast(result, out.dtype))
    )
    return statements


def _term(q: int, re: Expr, im: Expr | None, c: Expr, s: Expr, inverse: bool) -> Expr:
    """Part ``q`` (0 real, 1 imaginary) of ``(re + i im)(c ∓ i s)``: the forward
    transform multiplies by ``e^(-iθ) = c - i s``, the inverse by ``c + i s``."""
    if q == 0:  # re c ± im s
        if im is None:
            return kb.binary("mul", re, c)
        return kb.binary(
            "sub" if inverse else "add", kb.binary("mul", re, c), kb.binary("mul", im, s)
        )
    cross = kb.binary("mul", re, s)  # im c ∓ re s
    if im is None:
        return cross if inverse else kb.unary("neg", cross)
    return kb.binary("add" if inverse else "sub", kb.binary("mul", im, c), cross)


@lowers("DFT")
def lower_dft(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    where = f"DFT node {node.name!r}"
    rank = len(x.shape)
    if rank < 2 or x.shape[-1] not in (1, 2):
        raise LoweringError(
            f"{where}: the input {x.shape} needs a signal dim and a trailing dim of 1 (real) "
            "or 2 (complex)"
        )
    if not is_float(x.dtype):
        raise LoweringError(f"{where}: the input must be a float tensor, is {x.dtype}")
    if node.opset >= 20:
        axis = int(constant_scalar(ctx, node, 2, "axis")) if node.input(2) else -2
    else:
        axis = int(node.attr("axis", 1))
    axis = kb.normalize_axis(axis, rank, where)
    if axis == rank - 1:
        raise LoweringError(f"{where}: axis {axis} is the trailing real/imaginary dim")
    inverse = bool(int(node.attr("inverse", 0)))
    onesided = bool(int(node.attr("onesided", 0)))
    length = x.shape[axis]
    if node.input(1):
        n = int(constant_scalar(ctx, node, 1, "dft_length"))
    else:
        n = 2 * (length - 1) if inverse and onesided else length
    if n < 1:
        raise LoweringError(f"{where}: dft_length {n} must be positive")
    real_output = inverse and onesided
    bins = n // 2 + 1 if onesided and not inverse else n
    shape = [*x.shape[:-1], 1 if real_output else 2]
    shape[axis] = bins
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if not out.size:
        return
    complex_input = x.shape[-1] == 2
    dims = kb.dims("d", rank - 1)
    # the inverse real transform reads the bins 0 .. n//2 of its one-sided input
    time_bound = min(length, n // 2 + 1 if real_output else n)

    def read(stmt: str, full: list[str], q: int) -> Expr | None:
        if q == 1 and not complex_input:
            return None
        index = [("t" if r == axis else d) for r, d in enumerate(dims)]
        return kb.cast(kb.load(kb.access(x.name, stmt, full, [*index, str(q)]), x.dtype), WORK)

    statements = _contraction(ctx, out, dims, dims[axis], time_bound, read, inverse, n, real_output)
    if time_bound < 1:  # nothing to sum: keep the zeros, drop the empty sums
        statements = [s for s in statements if s.reduce is None]
    ctx.kernel(node, statements)


@lowers("STFT")
def lower_stft(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    where = f"STFT node {node.name!r}"
    if len(x.shape) != 3 or x.shape[-1] not in (1, 2):
        raise LoweringError(
            f"{where}: the signal {x.shape} must be (batch, length, 1) or (batch, length, 2)"
        )
    if not is_float(x.dtype):
        raise LoweringError(f"{where}: the signal must be a float tensor, is {x.dtype}")
    step = int(constant_scalar(ctx, node, 1, "frame_step"))
    window = ctx.buffer(node.input(2)) if node.input(2) else None
    if node.input(3):
        n = int(constant_scalar(ctx, node, 3, "frame_length"))
    else:
        n = window.shape[0] if window is not None else x.shape[1]
    if window is not None and window.shape != (n,):
        raise LoweringError(f"{where}: window {window.shape} must have frame_length {n} values")
    if step < 1 or n < 1 or n > x.shape[1]:
        raise LoweringError(
            f"{where}: frame_step {step} and frame_length {n} must be positive, and a frame "
            f"must fit in the signal of length {x.shape[1]}"
        )
    onesided = bool(int(node.attr("onesided", 1)))
    frames = (x.shape[1] - n) // step + 1
    bins = n // 2 + 1 if onesided else n
    out = ctx.output(node.outputs[0], [x.shape[0], frames, bins, 2], x.dtype)
    if not out.size:
        return
    dims = ["b", "f", "k"]

    def read(stmt: str, full: list[str], q: int) -> Expr | None:
        if q == 1 and x.shape[-1] == 1:
            return None
        sample = kb.load(kb.access(x.name, stmt, full, ["b", f"{step}*f + t", str(q)]), x.dtype)
        value = kb.cast(sample, WORK)
        if window is None:
            return value
        weight = kb.load(kb.access(window.name, stmt, full, ["t"]), window.dtype)
        return kb.binary("mul", value, kb.cast(weight, WORK))

    ctx.kernel(node, _contraction(ctx, out, dims, "k", n, read, False, n))
