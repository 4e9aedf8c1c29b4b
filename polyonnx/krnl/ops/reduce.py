"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp.

A reduction is an init statement, an update statement over the input's whole domain
whose write drops the reduced dims, and for some ops a finishing statement::

    S0: Y[d..] = identity
    S1: Y[d..] = Y[d..] <op> f(X[d.., r..])
    S2: Y[d..] = g(Y[d..])              (Mean: / n, L2: sqrt, LogSum: log)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Access, Expr, Statement, reduce_identity
from polyonnx.krnl.lower import LowerContext, lowers


@dataclass(frozen=True)
class Reduction:
    """The loop structure shared by every reduction over ``axes`` of a tensor."""

    shape: tuple[int, ...]
    axes: tuple[int, ...]
    keepdims: bool

    @property
    def loop_dims(self) -> list[str]:
        return [f"r{a}" if a in self.axes else f"d{a}" for a in range(len(self.shape))]

    @property
    def kept_dims(self) -> list[str]:
        return [d for d in self.loop_dims if d.startswith("d")]

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.keepdims:
            return tuple(1 if a in self.axes else n for a, n in enumerate(self.shape))
        return tuple(n for a, n in enumerate(self.shape) if a not in self.axes)

    @property
    def count(self) -> int:
        return int(np.prod([self.shape[a] for a in self.axes], dtype=np.int64))

    def out_index(self) -> list[str]:
        if self.keepdims:
            return ["0" if d.startswith("r") else d for d in self.loop_dims]
        return self.kept_dims

    def out_box(self, stmt: str) -> str:
        return kb.box(
            stmt, self.kept_dims, [n for a, n in enumerate(self.shape) if a not in self.axes]
        )

    def write(self, buffer: str, stmt: str, over_all: bool) -> Access:
        """The output at the kept dims, from the full loop domain or the kept one."""
        dims = self.loop_dims if over_all else self.kept_dims
        return kb.access(buffer, stmt, dims, self.out_index())

    def read(self, buffer: str, stmt: str, dtype: str) -> Expr:
        dims = self.loop_dims
        return kb.load(kb.access(buffer, stmt, dims, dims), dtype)

    def statements(
        self, out: str, x: str, dtype: str, op: str, update: Callable[[Expr], Expr], first: int = 0
    ) -> list[Statement]:
        """Init and update statements reducing ``update(x[..])`` into ``out``."""
        s_init, s_upd = f"S{first}", f"S{first + 1}"
        init = Statement(
            s_init, self.out_box(s_init), self.write(out, s_init, False), identity(op, dtype)
        )
        body = update(self.read(x, s_upd, dtype))
        upd = Statement(
            s_upd, kb.box(s_upd, self.loop_dims, self.shape), self.write(out, s_upd, True), body, op
        )
        return [init, upd]

    def finish(self, out: str, stmt: str, dtype: str, fn: Callable[[Expr], Expr]) -> Statement:
        """``out = fn(out)`` at every output point."""
        acc = self.write(out, stmt, False)
        return Statement(stmt, self.out_box(stmt), acc, fn(kb.load(acc, dtype)))


def identity(op: str, dtype: str) -> Expr:
    """The neutral element of a reduction operator in ``dtype``, as an expression."""
    return kb.const(reduce_identity(op, dtype), dtype)


def reduction_axes(
    ctx: LowerContext, node: Node, rank: int, axes_as_input: bool
) -> tuple[int, ...] | None:
    """The normalised axes of a Reduce* node; None means 'no reduction' (noop)."""
    if axes_as_input:
        axes = ctx.require_constant(node, 1, "axes").tolist() if node.input(1) else []
    else:
        axes = list(node.attr("axes", ()) or ())
    if not axes:
        if int(node.attr("noop_with_empty_axes", 0)):
            return None
        return tuple(range(rank))
    return tuple(kb.normalize_axes(axes, rank, f"{node.op_type} node {node.name!r}"))


# op_type → (reduce op, per-element transform, finishing transform given count)
Fn = Callable[[Expr], Expr]
REDUCE: dict[str, tuple[str, Fn | None, Callable[[Expr, int], Expr] | None]] = {
    "ReduceSum": ("add", None, None),
    "ReduceMean": ("add", None, lambda y, n: kb.binary("div", y, kb.const(max(n, 1), y.dtype))),
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("mul", None, None),
    "ReduceL1": ("add", lambda x: kb.unary("abs", x), None),
    "ReduceL2": ("add", lambda x: kb.binary("mul", x, x), lambda y, n: kb.unary("sqrt", y)),
    "ReduceSumSquare": ("add", lambda x: kb.binary("mul", x, x), None),
    "ReduceLogSum": ("add", None, lambda y, n: kb.unary("log", y)),
}
AXES_INPUT_SINCE = {"ReduceSum": 13}


@lowers(*REDUCE, "ReduceLogSumExp")
def lower_reduce(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    axes = reduction_axes(ctx, node, rank, node.opset >= AXES_INPUT_SINCE.get(node.op_type, 18))
    if axes is None:
        ctx.view(node.outputs[0], x.name, x.shape)
        return
    red = Reduction(x.shape, axes, bool(int(node.attr("keepdims", 1))))
    out = ctx.output(node.outputs[0], red.out_shape, x.dtype)
    if node.op_type == "ReduceLogSumExp":
        ctx.kernel(node, _logsumexp(ctx, red, x.name, out.name, x.dtype))
        return
    op, elem, finish = REDUCE[node.op_type]
    stmts = red.statements(out.name, x.name, x.dtype, op, elem or (lambda e: e))
    if finish is not None:
        stmts.append(red.finish(out.name, "S2", x.dtype, lambda y: finish(y, red.count)))
    ctx.kernel(node, stmts)


def _logsumexp(ctx: LowerContext, red: Reduction, x: str, out: str, dtype: str) -> list[Statement]:
    """max-shifted: m = max x; y = log(sum exp(x - m)) + m, where an infinite m shifts by 0
    (so that an all -inf row gives -inf and a row holding +inf gives +inf, not inf - inf)."""
    m = ctx.temp(out + ".max", red.out_shape, dtype).name
    stmts = red.statements(m, x, dtype, "max", lambda e: e)

    def shift(m_at: Expr) -> Expr:
        return kb.select(kb.unary("isinf", m_at, "bool"), kb.const(0, dtype), m_at)

    m_s3 = shift(kb.load(red.write(m, "S3", True), dtype))
    stmts += red.statements(
        out, x, dtype, "add", lambda e: kb.unary("exp", kb.binary("sub", e, m_s3)), 2
    )

    def finish(y: Expr) -> Expr:
        m_s4 = shift(kb.load(red.write(m, "S4", False), dtype))
        return kb.binary("add", kb.unary("log", y), m_s4)

    stmts.append(red.finish(out, "S4", dtype, finish))
    return stmts
