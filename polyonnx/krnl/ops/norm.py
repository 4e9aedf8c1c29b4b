"""Normalisations: BatchNormalization (inference), InstanceNormalization,
LayerNormalization, GroupNormalization, RMSNormalization, MeanVarianceNormalization,
LpNormalization and LRN.

All but BatchNormalization and LRN share one kernel shape: statistics over some axes of X
(kept as size-1 dims), each a sum reduction finished in place, then one elementwise
statement over X::

    S0: mean[k] = 0
    S1: mean[k] += x[k, r]                      (centred ops only)
    S2: mean[k] = mean[k] / n
    S3: inv[k]  = 0
    S4: inv[k]  += (x[k, r] - mean[k])^2        (two-pass variance; RMS/Lp: x^2 or |x|)
    S5: inv[k]  = 1 / sqrt(inv[k] / n + eps)    (the op's finish)
    S6: y[k, r] = ((x[k, r] - mean[k]) * inv[k]) * scale + bias

Statistics are computed in the op's stash type (float32 unless ``stash_type`` says
otherwise; float16 inputs are always widened). BatchNormalization folds its four
parameters into one per-channel scale and shift (in numpy when they are constants), so
its kernel is one multiply-add per element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Expr, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.elementwise import ONNX_DTYPES
from polyonnx.krnl.ops.reduce import Reduction

Epilogue = Callable[[Expr, str, list[str]], Expr]
"""The affine second stage: (normalised value in X's dtype, statement, loop dims) → y."""


# ---- shared helpers ------------------------------------------------------------------


def _float_input(node: Node, x: Buffer) -> None:
    if not is_float(x.dtype):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: input {x.name!r} has dtype {x.dtype}; "
            "normalisations are defined on float tensors only"
        )


def _widened(dtype: str) -> str:
    """The dtype statistics are computed in when no stash_type says otherwise."""
    return "float32" if dtype == "float16" else dtype


def _stash_dtype(node: Node) -> str:
    code = int(node.attr("stash_type", 1))
    dtype = ONNX_DTYPES.get(code)
    if dtype is None or not is_float(dtype):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: stash_type {code} is not a supported float "
            "type (float16, float32 or float64)"
        )
    return dtype


def _axis(node: Node, rank: int, default: int) -> int:
    return kb.normalize_axis(node.attr("axis", default), rank, _where(node))


def _where(node: Node) -> str:
    return f"{node.op_type} node {node.name!r}"


def _last_axis(node: Node, x: Buffer) -> int:
    """The ``axis`` (default -1, normalised) of a normalisation that needs a float input of
    rank >= 1: LayerNormalization, RMSNormalization, LpNormalization."""
    _float_input(node, x)
    if not x.shape:
        raise LoweringError(f"{_where(node)}: input is a scalar")
    return _axis(node, len(x.shape), -1)


def _present(names: Sequence[str], index: int) -> str:
    return names[index] if index < len(names) else ""


def _stat_buffer(
    ctx: LowerContext, node: Node, index: int, hint: str, red: Reduction, dtype: str
) -> str:
    """Optional output ``index`` of ``node`` when it is requested, else a temp."""
    name = _present(node.outputs, index)
    if name:
        return ctx.output(name, red.out_shape, dtype).name
    return ctx.temp(hint, red.out_shape, dtype).name


def _loaded(ctx: LowerContext, name: str, stmt: str, dims: list[str], index: list[str]) -> Expr:
    buf = ctx.buffer(name)
    return kb.load(kb.access(name, stmt, dims, index), buf.dtype)


# ---- the moments kernel --------------------------------------------------------------


def normalize(
    ctx: LowerContext,
    x: Buffer,
    red: Reduction,
    out: str,
    stash: str,
    *,
    centre: bool,
    term: Callable[[Expr], Expr],
    finish: Callable[[Expr], Expr],
    epilogue: Epilogue | None = None,
    mean: str | None = None,
    inv: str | None = None,
) -> list[Statement]:
    """The statements of a moments normalisation of ``x`` over ``red.axes`` into ``out``.

    ``mean`` and ``inv`` name the statistics buffers (``red.out_shape``, dtype ``stash``);
    temps are made for the ones not given. ``term`` maps ``x - mean`` (or ``x``) to the
    summand of the second reduction and ``finish`` maps that sum to the per-row factor.
    """
    dims = red.loop_dims
    stmts: list[Statement] = []

    def name() -> str:
        return f"S{len(stmts)}"

    def stat(buffer: str, stmt: str, over_all: bool = True) -> Expr:
        return kb.load(red.write(buffer, stmt, over_all), stash)

    def x_at(stmt: str) -> Expr:
        return kb.cast(red.read(x.name, stmt, x.dtype), stash)

    def centred(stmt: str) -> Expr:
        return kb.binary("sub", x_at(stmt), stat(mean, stmt)) if centre else x_at(stmt)

    def reduce_into(buffer: str, body: Callable[[str], Expr]) -> None:
        s = name()
        stmts.append(Statement(s, red.out_box(s), red.write(buffer, s, False), kb.const(0, stash)))
        s = name()
        stmts.append(
            Statement(s, kb.box(s, dims, x.shape), red.write(buffer, s, True), body(s), "add")
        )

    if centre:
        mean = mean or ctx.temp(out + ".mean", red.out_shape, stash).name
        reduce_into(mean, x_at)
        stmts.append(red.finish(mean, name(), stash, lambda m: _over(m, red.count)))
    inv = inv or ctx.temp(out + ".inv", red.out_shape, stash).name
    reduce_into(inv, lambda s: term(centred(s)))
    stmts.append(red.finish(inv, name(), stash, finish))
    s = name()
    y = kb.cast(kb.binary("mul", centred(s), stat(inv, s)), x.dtype)
    if epilogue is not None:
        y = epilogue(y, s, dims)
    stmts.append(Statement(s, kb.box(s, dims, x.shape), kb.access(out, s, dims, dims), y))
    return stmts


def _over(total: Expr, n: int) -> Expr:
    return kb.binary("div", total, kb.const(max(n, 1), total.dtype))


def _square(e: Expr) -> Expr:
    return kb.binary("mul", e, e)


def _inv_std(n: int, eps: float) -> Callable[[Expr], Expr]:
    """sum of squares → 1 / sqrt(sum / n + eps)."""

    def finish(total: Expr) -> Expr:
        var = kb.binary("add", _over(total, n), kb.const(eps, total.dtype))
        return kb.unary("reciprocal", kb.unary("sqrt", var))

    return finish


def _scale_bias(scale: Expr | None, bias: Expr | None, y: Expr) -> Expr:
    if scale is not None:
        y = kb.binary("mul", y, kb.cast(scale, y.dtype))
    if bias is not None:
        y = kb.binary("add", y, kb.cast(bias, y.dtype))
    return y


def _broadcast_affine(ctx: LowerContext, scale: str, bias: str) -> Epilogue:
    """``y * scale + bias`` with both numpy-broadcast against X (absent ones skipped)."""

    def epilogue(y: Expr, stmt: str, dims: list[str]) -> Expr:
        s = ctx.operand(scale, stmt, dims) if scale else None
        b = ctx.operand(bias, stmt, dims) if bias else None
        return _scale_bias(s, b, y)

    return epilogue


def _check_shape(
    node: Node, ctx: LowerContext, name: str, what: str, shape: tuple[int, ...]
) -> None:
    if not name:
        raise LoweringError(f"{node.op_type} node {node.name!r}: input {what} is missing")
    value = ctx.constant(name)  # (a constant is not registered as a buffer just to check)
    got = tuple(value.shape) if value is not None else ctx.buffer(name).shape
    if got != tuple(shape):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: {what} {name!r} has shape {got}, "
            f"expected {tuple(shape)}"
        )


# ---- BatchNormalization ----------------------------------------------------------------


@lowers("BatchNormalization")
def lower_batchnorm(ctx: LowerContext, node: Node) -> None:
    """Inference form: y = x * a[c] + b[c] with a = scale / sqrt(var + eps) and
    b = B - mean * a. Opset 7's ``spatial=0`` gives per-activation parameters of shape
    (C, D1, …). Training (``training_mode=1``, or the running/saved statistics outputs)
    is refused."""
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    extra = [name for name in node.outputs[1:] if name]
    training = int(node.attr("training_mode", 0))
    if training or extra:
        why = "training_mode=1" if training else f"statistics outputs {extra}"
        raise LoweringError(
            f"BatchNormalization node {node.name!r} runs in training mode ({why}): batch "
            "statistics and running-mean updates are not lowered; polyonnx compiles inference only"
        )
    if len(x.shape) < 2:
        raise LoweringError(
            f"BatchNormalization node {node.name!r}: input {x.name!r} has shape {x.shape}; "
            "it needs a batch and a channel dim"
        )
    spatial = node.opset >= 9 or int(node.attr("spatial", 1))
    pshape = (x.shape[1],) if spatial else tuple(x.shape[1:])
    params = [node.input(i) for i in range(1, 5)]
    for name, what in zip(params, ("scale", "B", "mean", "var"), strict=True):
        _check_shape(node, ctx, name, what, pshape)
    eps = float(node.attr("epsilon", 1e-5))
    cd = _widened(x.dtype)
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    dims = kb.dims("d", len(x.shape))
    pdims = dims[1 : 1 + len(pshape)]
    values = [ctx.constant(name) for name in params]
    stmts: list[Statement] = []
    if all(v is not None for v in values):
        scale, bias, mean, var = (np.asarray(v, np.float64).reshape(pshape) for v in values)
        a = scale / np.sqrt(var + eps)
        a_name = ctx.add_constant(out + ".bn_scale", a.astype(cd)).name
        b_name = ctx.add_constant(out + ".bn_shift", (bias - mean * a).astype(cd)).name
    else:
        a_name, b_name = _batchnorm_factors(ctx, params, pshape, eps, cd, out, stmts)
    s = f"S{len(stmts)}"
    a_at = kb.load(kb.access(a_name, s, dims, pdims), cd)
    b_at = kb.load(kb.access(b_name, s, dims, pdims), cd)
    x_at = kb.cast(kb.load(kb.access(x.name, s, dims, dims), x.dtype), cd)
    y = kb.cast(kb.binary("add", kb.binary("mul", x_at, a_at), b_at), x.dtype)
    stmts.append(Statement(s, kb.box(s, dims, x.shape), kb.access(out, s, dims, dims), y))
    ctx.kernel(node, stmts)


def _batchnorm_factors(
    ctx: LowerContext,
    params: list[str],
    pshape: tuple[int, ...],
    eps: float,
    cd: str,
    out: str,
    stmts: list[Statement],
) -> tuple[str, str]:
    """Statements computing the per-channel scale and shift from tensor parameters."""
    a = ctx.temp(out + ".bn_scale", pshape, cd).name
    b = ctx.temp(out + ".bn_shift", pshape, cd).name
    pdims = kb.dims("c", len(pshape))

    def param(i: int, stmt: str) -> Expr:
        return kb.cast(_loaded(ctx, params[i], stmt, pdims, pdims), cd)

    var = kb.binary("add", param(3, "S0"), kb.const(eps, cd))
    body = kb.binary("mul", param(0, "S0"), kb.unary("reciprocal", kb.unary("sqrt", var)))
    stmts.append(
        Statement("S0", kb.box("S0", pdims, pshape), kb.access(a, "S0", pdims, pdims), body)
    )
    a_at = kb.load(kb.access(a, "S1", pdims, pdims), cd)
    shift = kb.binary("sub", param(1, "S1"), kb.binary("mul", param(2, "S1"), a_at))
    stmts.append(
        Statement("S1", kb.box("S1", pdims, pshape), kb.access(b, "S1", pdims, pdims), shift)
    )
    return a, b


# ---- Instance / Layer / Group / RMS / MVN / Lp -----------------------------------------


@lowers("InstanceNormalization")
def lower_instancenorm(ctx: LowerContext, node: Node) -> None:
    """y = scale[c] * (x - mean) / sqrt(var + eps) + B[c], statistics per (n, c) over the
    spatial dims."""
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    rank = len(x.shape)
    if rank < 2:
        raise LoweringError(
            f"InstanceNormalization node {node.name!r}: input shape {x.shape} has no channel dim"
        )
    for i, what in ((1, "scale"), (2, "B")):
        _check_shape(node, ctx, node.input(i), what, (x.shape[1],))
    red = Reduction(x.shape, tuple(range(2, rank)), keepdims=True)
    eps = float(node.attr("epsilon", 1e-5))
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name

    def epilogue(y: Expr, stmt: str, dims: list[str]) -> Expr:
        scale = _loaded(ctx, node.input(1), stmt, dims, [dims[1]])
        bias = _loaded(ctx, node.input(2), stmt, dims, [dims[1]])
        return _scale_bias(scale, bias, y)

    stash = _widened(x.dtype)
    stmts = normalize(
        ctx, x, red, out, stash, centre=True, term=_square,
        finish=_inv_std(red.count, eps), epilogue=epilogue,
    )  # fmt: skip
    ctx.kernel(node, stmts)


@lowers("LayerNormalization")
def lower_layernorm(ctx: LowerContext, node: Node) -> None:
    """Normalise over axes ``axis..rank-1``; optional outputs Mean and InvStdDev have
    X's shape with those axes set to 1, in the stash type."""
    x = ctx.buffer(node.inputs[0])
    axis = _last_axis(node, x)
    red = Reduction(x.shape, tuple(range(axis, len(x.shape))), keepdims=True)
    stash = _stash_dtype(node)
    eps = float(node.attr("epsilon", 1e-5))
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    mean = _stat_buffer(ctx, node, 1, out + ".mean", red, stash)
    inv = _stat_buffer(ctx, node, 2, out + ".inv", red, stash)
    stmts = normalize(
        ctx, x, red, out, stash, centre=True, term=_square, finish=_inv_std(red.count, eps),
        epilogue=_broadcast_affine(ctx, node.input(1), node.input(2)), mean=mean, inv=inv,
    )  # fmt: skip
    ctx.kernel(node, stmts)


@lowers("RMSNormalization")
def lower_rmsnorm(ctx: LowerContext, node: Node) -> None:
    """y = x / sqrt(mean(x^2 over axes axis..rank-1) + eps) * scale."""
    x = ctx.buffer(node.inputs[0])
    axis = _last_axis(node, x)
    red = Reduction(x.shape, tuple(range(axis, len(x.shape))), keepdims=True)
    eps = float(node.attr("epsilon", 1e-5))
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    stmts = normalize(
        ctx, x, red, out, _stash_dtype(node), centre=False, term=_square,
        finish=_inv_std(red.count, eps), epilogue=_broadcast_affine(ctx, node.input(1), ""),
    )  # fmt: skip
    ctx.kernel(node, stmts)


@lowers("GroupNormalization")
def lower_groupnorm(ctx: LowerContext, node: Node) -> None:
    """Statistics per (n, group) over the group's channels and the spatial dims.

    X is viewed (no copy) as (N, G, C/G, D) with D the product of the spatial dims, and Y
    is written through the same view. Opset 18 has one scale and bias per group; opset
    21 one per channel and a ``stash_type``.
    """
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    if len(x.shape) < 2:
        raise LoweringError(
            f"GroupNormalization node {node.name!r}: input shape {x.shape} has no channel dim"
        )
    n, c = x.shape[:2]
    groups = int(node.attr("num_groups", 0))
    if groups <= 0 or c % groups:
        raise LoweringError(
            f"GroupNormalization node {node.name!r}: num_groups={groups} does not divide the "
            f"{c} channels"
        )
    per_group = node.opset < 21
    for i, what in ((1, "scale"), (2, "bias")):
        _check_shape(node, ctx, node.input(i), what, (groups if per_group else c,))
    cpg = c // groups
    grouped = (n, groups, cpg, int(np.prod(x.shape[2:], dtype=np.int64)))
    out = node.outputs[0]
    xg = f"{out}.x_grouped"
    ctx.view(xg, x.name, grouped)
    yg = ctx.output(f"{out}.grouped", grouped, x.dtype).name
    red = Reduction(grouped, (2, 3), keepdims=True)
    stash = _stash_dtype(node) if node.opset >= 21 else _widened(x.dtype)
    eps = float(node.attr("epsilon", 1e-5))

    def epilogue(y: Expr, stmt: str, dims: list[str]) -> Expr:
        index = [dims[1]] if per_group else [f"{cpg}*{dims[1]} + {dims[2]}"]
        scale = _loaded(ctx, node.input(1), stmt, dims, index)
        bias = _loaded(ctx, node.input(2), stmt, dims, index)
        return _scale_bias(scale, bias, y)

    stmts = normalize(
        ctx, ctx.buffer(xg), red, yg, stash, centre=True, term=_square,
        finish=_inv_std(red.count, eps), epilogue=epilogue,
    )  # fmt: skip
    ctx.kernel(node, stmts)
    ctx.view(out, yg, x.shape)


@lowers("MeanVarianceNormalization")
def lower_mvn(ctx: LowerContext, node: Node) -> None:
    """y = (x - mean) / (sqrt(var) + 1e-9) over ``axes`` (default [0, 2, 3]), as the
    ONNX function body defines it."""
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    rank = len(x.shape)
    axes = kb.normalize_axes(node.attr("axes", None) or (0, 2, 3), rank, _where(node))
    red = Reduction(x.shape, tuple(axes), keepdims=True)
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name

    def finish(total: Expr) -> Expr:
        std = kb.unary("sqrt", _over(total, red.count))
        return kb.unary("reciprocal", kb.binary("add", std, kb.const(1e-9, total.dtype)))

    stmts = normalize(ctx, x, red, out, _widened(x.dtype), centre=True, term=_square, finish=finish)
    ctx.kernel(node, stmts)


@lowers("LpNormalization")
def lower_lpnorm(ctx: LowerContext, node: Node) -> None:
    """y = x / ||x||_p along ``axis`` (p = 1 or 2); a zero norm gives 0, not NaN."""
    x = ctx.buffer(node.inputs[0])
    axis = _last_axis(node, x)
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise LoweringError(f"LpNormalization node {node.name!r}: p={p}; only 1 and 2 exist")
    red = Reduction(x.shape, (axis,), keepdims=True)
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name

    def finish(total: Expr) -> Expr:
        norm = kb.unary("sqrt", total) if p == 2 else total
        zero = kb.const(0, total.dtype)
        is_zero = kb.binary("eq", norm, zero, "bool")
        return kb.select(is_zero, zero, kb.unary("reciprocal", norm))

    term = _square if p == 2 else (lambda e: kb.unary("abs", e))
    stmts = normalize(ctx, x, red, out, _widened(x.dtype), centre=False, term=term, finish=finish)
    ctx.kernel(node, stmts)


# ---- LRN -------------------------------------------------------------------------------


@lowers("LRN")
def lower_lrn(ctx: LowerContext, node: Node) -> None:
    """y = x / (bias + alpha / size * square_sum) ^ beta, where square_sum sums x^2 over
    the channel window [c - floor((size-1)/2), c + ceil((size-1)/2)]. The window is a
    reduction dim ``k`` whose domain is clipped to the channels that exist."""
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    rank = len(x.shape)
    size = int(node.attr("size", 0))
    if rank < 2 or size <= 0:
        raise LoweringError(
            f"LRN node {node.name!r}: needs an (N, C, ...) input and size >= 1 "
            f"(got shape {x.shape}, size={size})"
        )
    alpha = float(node.attr("alpha", 1e-4))
    beta = float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    lo = (size - 1) // 2
    cd = _widened(x.dtype)
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    sq = ctx.temp(out + ".square_sum", x.shape, cd).name
    dims = kb.dims("d", rank)
    c = dims[1]
    init = Statement(
        "S0", kb.box("S0", dims, x.shape), kb.access(sq, "S0", dims, dims), kb.const(0, cd)
    )
    wdims = [*dims, "k"]
    bounds = " and ".join(f"0 <= {d} < {n}" for d, n in zip(wdims, [*x.shape, size], strict=True))
    window = f"{{ S1[{', '.join(wdims)}] : {bounds} and 0 <= {c} - {lo} + k < {x.shape[1]} }}"
    src = [d if d != c else f"{c} - {lo} + k" for d in dims]
    xk = kb.cast(kb.load(kb.access(x.name, "S1", wdims, src), x.dtype), cd)
    upd = Statement("S1", window, kb.access(sq, "S1", wdims, dims), _square(xk), "add")
    x_at = kb.cast(kb.load(kb.access(x.name, "S2", dims, dims), x.dtype), cd)
    sq_at = kb.load(kb.access(sq, "S2", dims, dims), cd)
    base = kb.binary("add", kb.const(bias, cd), kb.binary("mul", kb.const(alpha / size, cd), sq_at))
    y = kb.cast(kb.binary("div", x_at, _power(base, beta)), x.dtype)
    final = Statement("S2", kb.box("S2", dims, x.shape), kb.access(out, "S2", dims, dims), y)
    ctx.kernel(node, [init, upd, final])


def _power(base: Expr, beta: float) -> Expr:
    """base ** beta; for beta a multiple of 1/4 up to 1 (LRN's usual 0.75), square roots
    instead of pow, which a float runs as exp and log in double: base**0.75 = sqrt(base) *
    sqrt(sqrt(base)), within 4 ulp. ZFNet's first LRN (96 x 110 x 110) took 1.97 ms."""
    if beta not in (0.25, 0.5, 0.75, 1.0):
        return kb.binary("pow", base, kb.const(beta, base.dtype))
    if beta == 1.0:
        return base
    root = kb.unary("sqrt", base)
    if beta == 0.5:
        return root
    fourth = kb.unary("sqrt", root)
    return fourth if beta == 0.25 else kb.binary("mul", root, fourth)
