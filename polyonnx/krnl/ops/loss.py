"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

The input is scores ``X[N, C, d1..]`` and an index tensor ``T[N, d1..]`` of classes. Each
target position reads the score of its class with a LoadAt (a computed index; codegen
clamps it into the buffer), weighted by ``W[T]`` (or 1). A target equal to
``ignore_index`` contributes 0 and its weight is 0, so the mean leaves it out; any other
target outside ``[0, C)`` is a run-time error (a Checked: the run raises RunError)::

    l[n, d..] = T[n, d..] == ignore ? 0 : -W[T[n, d..]] * X[n, T[n, d..], d..]

    none:  L[n, d..] = l[n, d..]
    sum:   S0: L = 0             S1: L += l[n, d..]
    mean:  ... and S2: D = 0     S3: D += w[n, d..]     S4: L = L / D
           (D is the number of targets when there is neither a weight nor an ignore_index)

SoftmaxCrossEntropyLoss first takes a max-shifted log-softmax over the class axis, as two
reductions into ``[N, 1, d1..]`` temps, and reads the score of the target class as
``X[n, T, d..] - m[n, 0, d..] - log(s[n, 0, d..])``; its optional second output, log_prob,
is written in full only when it is asked for::

    S0: m = -inf          S1: m = max(m, X)
    S2: s = 0             S3: s += exp(X - m)
    (S4: log_prob = X - m - log(s))

float16 inputs are summed, shifted and weighted in float32 and rounded once at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Checked, CheckSite, Expr, Iter, LoadAt, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.reduce import Reduction, identity

REDUCTIONS = ("none", "sum", "mean")

Score = Callable[[str, list[str], Expr], Expr]
"""(statement, target dims, class index as int64) → the target's log-probability."""


@dataclass(frozen=True)
class Loss:
    """What a loss node asks for, checked against the shapes of its operands."""

    x: Buffer
    target: Buffer
    weight: Buffer | None
    reduction: str
    ignore_index: int | None
    site: CheckSite
    """Where a target outside the classes (and not ignore_index) is reported."""

    @property
    def acc_dtype(self) -> str:
        """Where sums and the log-softmax are computed: float32 for float16 inputs."""
        return "float32" if self.x.dtype == "float16" else self.x.dtype

    @property
    def dims(self) -> list[str]:
        """The loop over target positions: ``n, d1, ...``."""
        return kb.dims("t", len(self.target.shape))

    def out_shape(self) -> tuple[int, ...]:
        return self.target.shape if self.reduction == "none" else ()


def _loss(ctx: LowerContext, node: Node) -> Loss:
    where = f"{node.op_type} node {node.name!r}"
    x, target = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    if not is_float(x.dtype):
        raise LoweringError(f"{where}: scores have dtype {x.dtype}; only float tensors are lowered")
    if target.dtype not in ("int32", "int64"):
        raise LoweringError(f"{where}: target must be int32 or int64, got {target.dtype}")
    if len(x.shape) < 2:
        raise LoweringError(f"{where}: scores must be [N, C, d1, ...], got shape {list(x.shape)}")
    if target.shape != (x.shape[0], *x.shape[2:]):
        raise LoweringError(
            f"{where}: target of shape {list(target.shape)} does not match scores of shape "
            f"{list(x.shape)} (expected {[x.shape[0], *x.shape[2:]]})"
        )
    weight = ctx.buffer(node.input(2)) if node.input(2) else None
    if weight is not None and (weight.shape != (x.shape[1],) or weight.dtype != x.dtype):
        raise LoweringError(
            f"{where}: weight must be a {x.dtype} vector of {x.shape[1]} class weights, got "
            f"{weight.dtype} of shape {list(weight.shape)}"
        )
    reduction = node.attr("reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    if reduction not in REDUCTIONS:
        raise LoweringError(f"{where}: unknown reduction {reduction!r} (expected {REDUCTIONS})")
    ignore = node.attr("ignore_index")
    ignore = None if ignore is None else int(ignore)
    classes = x.shape[1]
    besides = "" if ignore is None else f" and is not ignore_index {ignore}"
    message = (
        f"target {{value}} is out of range [0, {classes - 1}] (the classes of "
        f"{node.inputs[0]!r}){besides}"
    )
    site = CheckSite(node.name, node.op_type, message)
    return Loss(x, target, weight, reduction, ignore, site)


# ---- the likelihood part, shared ------------------------------------------------------


def nll_statements(
    ctx: LowerContext, loss: Loss, out: Buffer, score: Score, first: int
) -> list[Statement]:
    """The statements that turn per-target log-probabilities (``score``) into the loss
    ``out``, numbered from ``S{first}``."""
    dims, acc_dt = loss.dims, loss.acc_dtype
    shape = loss.target.shape

    def target(stmt: str) -> Expr:
        t = kb.load(kb.access(loss.target.name, stmt, dims, dims), loss.target.dtype)
        return kb.cast(t, "int64")

    def cls(stmt: str) -> Expr:
        """The target class, checked: in [0, C), or ignore_index."""
        t = target(stmt)
        ok = kb.binary(
            "and",
            kb.binary("ge", t, kb.const(0, "int64"), "bool"),
            kb.binary("lt", t, kb.const(loss.x.shape[1], "int64"), "bool"),
        )
        skip = ignored(stmt)
        return Checked("int64", t, ok if skip is None else kb.binary("or", ok, skip), loss.site)

    def ignored(stmt: str) -> Expr | None:
        if loss.ignore_index is None:
            return None
        return kb.binary("eq", target(stmt), kb.const(loss.ignore_index, "int64"), "bool")

    def weight(stmt: str) -> Expr:
        w: Expr = kb.const(1, acc_dt)
        if loss.weight is not None:
            w = kb.cast(LoadAt(loss.weight.dtype, loss.weight.name, (cls(stmt),)), acc_dt)
        skip = ignored(stmt)
        return w if skip is None else kb.select(skip, kb.const(0, acc_dt), w)

    def term(stmt: str) -> Expr:
        value = kb.unary("neg", score(stmt, dims, cls(stmt)))
        if loss.weight is not None:
            value = kb.binary("mul", weight(stmt), value)
        skip = ignored(stmt)  # 0 even where the ignored class's score is inf or NaN
        return value if skip is None else kb.select(skip, kb.const(0, acc_dt), value)

    def stmt_name(offset: int) -> str:
        return f"S{first + offset}"

    if loss.reduction == "none":
        s = stmt_name(0)
        write = kb.access(out.name, s, dims, dims)
        return [Statement(s, kb.box(s, dims, shape), write, kb.cast(term(s), out.dtype))]

    total = out if out.dtype == acc_dt else ctx.temp(out.name + ".sum", (), acc_dt)
    stmts = _sum_into(total, dims, shape, term, first)
    if loss.reduction == "mean":
        s = stmt_name(len(stmts))
        if loss.weight is None and loss.ignore_index is None:
            count = int(np.prod(shape, dtype=np.int64))
            denominator: Expr = kb.const(count, acc_dt)
        else:
            den = ctx.temp(out.name + ".weight", (), acc_dt)
            stmts += _sum_into(den, dims, shape, weight, first + len(stmts))
            s = stmt_name(len(stmts))
            denominator = kb.load(kb.access(den.name, s, [], []), acc_dt)
        mean = kb.binary("div", kb.load(kb.access(total.name, s, [], []), acc_dt), denominator)
        mean = kb.cast(mean, out.dtype)
        stmts.append(Statement(s, kb.box(s, [], []), kb.access(out.name, s, [], []), mean))
    elif total is not out:
        s = stmt_name(len(stmts))
        value = kb.cast(kb.load(kb.access(total.name, s, [], []), acc_dt), out.dtype)
        stmts.append(Statement(s, kb.box(s, [], []), kb.access(out.name, s, [], []), value))
    return stmts


def _sum_into(
    acc: Buffer, dims: list[str], shape: tuple[int, ...], term: Callable[[str], Expr], first: int
) -> list[Statement]:
    """``acc = 0; acc += term`` over every target position (acc is a scalar)."""
    s0, s1 = f"S{first}", f"S{first + 1}"
    init = Statement(
        s0, kb.box(s0, [], []), kb.access(acc.name, s0, [], []), identity("add", acc.dtype)
    )
    update = Statement(
        s1, kb.box(s1, dims, shape), kb.access(acc.name, s1, dims, []), term(s1), "add"
    )
    return [init, update]


# ---- the two ops ----------------------------------------------------------------------


@lowers("NegativeLogLikelihoodLoss")
def lower_nll_loss(ctx: LowerContext, node: Node) -> None:
    loss = _loss(ctx, node)
    x = loss.x

    def score(stmt: str, dims: list[str], cls: Expr) -> Expr:
        index = (Iter("int64", dims[0]), cls, *(Iter("int64", d) for d in dims[1:]))
        return kb.cast(LoadAt(x.dtype, x.name, index), loss.acc_dtype)

    out = ctx.output(node.outputs[0], loss.out_shape(), x.dtype)
    ctx.kernel(node, nll_statements(ctx, loss, out, score, 0))


@lowers("SoftmaxCrossEntropyLoss")
def lower_softmax_cross_entropy_loss(ctx: LowerContext, node: Node) -> None:
    loss = _loss(ctx, node)
    x, acc_dt = loss.x, loss.acc_dtype
    red = Reduction(x.shape, (1,), keepdims=True)
    m = ctx.temp(node.outputs[0] + ".max", red.out_shape, x.dtype)
    s = ctx.temp(node.outputs[0] + ".sum", red.out_shape, acc_dt)
    stmts = red.statements(m.name, x.name, x.dtype, "max", lambda e: e)

    def shifted(stmt: str) -> Expr:
        """``X - m`` over the full loop (in the accumulation dtype)."""
        value = kb.cast(red.read(x.name, stmt, x.dtype), acc_dt)
        return kb.binary(
            "sub", value, kb.cast(kb.load(red.write(m.name, stmt, True), x.dtype), acc_dt)
        )

    full = red.loop_dims
    stmts.append(
        Statement("S2", red.out_box("S2"), red.write(s.name, "S2", False), kb.const(0, acc_dt))
    )
    stmts.append(
        Statement(
            "S3",
            kb.box("S3", full, x.shape),
            red.write(s.name, "S3", True),
            kb.unary("exp", shifted("S3")),
            "add",
        )
    )
    if len(node.outputs) > 1 and node.outputs[1]:
        log_prob = ctx.output(node.outputs[1], x.shape, x.dtype)
        s4 = "S4"
        log_sum = kb.unary("log", kb.load(red.write(s.name, s4, True), acc_dt))
        value = kb.cast(kb.binary("sub", shifted(s4), log_sum), x.dtype)
        write = kb.access(log_prob.name, s4, full, full)
        stmts.append(Statement(s4, kb.box(s4, full, x.shape), write, value))

    def score(stmt: str, dims: list[str], cls: Expr) -> Expr:
        """``X[n, cls, d..] - m[n, 0, d..] - log(s[n, 0, d..])``."""
        index = (Iter("int64", dims[0]), cls, *(Iter("int64", d) for d in dims[1:]))
        reduced = [dims[0], "0", *dims[1:]]
        picked = kb.cast(LoadAt(x.dtype, x.name, index), acc_dt)
        top = kb.cast(kb.load(kb.access(m.name, stmt, dims, reduced), x.dtype), acc_dt)
        log_sum = kb.unary("log", kb.load(kb.access(s.name, stmt, dims, reduced), acc_dt))
        return kb.binary("sub", kb.binary("sub", picked, top), log_sum)

    out = ctx.output(node.outputs[0], loss.out_shape(), x.dtype)
    stmts += nll_statements(ctx, loss, out, score, len(stmts))
    ctx.kernel(node, stmts)
