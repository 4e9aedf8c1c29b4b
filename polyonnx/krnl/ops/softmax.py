"""Softmax and LogSoftmax as max-shifted reductions over the normalised axes.

Opset >= 13 normalises over one axis (default -1); older opsets coerce the input to 2-D
at ``axis`` (default 1) and normalise over every trailing dim::

    m = max x            (over the axes)
    y = exp(x - m)       Softmax          | y = x - m          LogSoftmax
    s = sum y            | s = sum exp(y)
    y = y / s            | y = y - log(s)
"""

from __future__ import annotations

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Statement
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.reduce import Reduction


@lowers("Softmax", "LogSoftmax")
def lower_softmax(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    where = f"{node.op_type} node {node.name!r}"
    if node.opset >= 13:
        axes = (kb.normalize_axis(node.attr("axis", -1), rank, where),) if rank else ()
    else:  # coerced to 2-D at axis: normalise over every trailing dim; axis may be rank
        axis = int(node.attr("axis", 1))
        axes = tuple(range(kb.normalize_axis(axis, rank, where), rank)) if axis != rank else ()
    red = Reduction(x.shape, axes, keepdims=True)
    dt = x.dtype
    out = ctx.output(node.outputs[0], x.shape, dt).name
    m = ctx.temp(out + ".max", red.out_shape, dt).name
    s = ctx.temp(out + ".sum", red.out_shape, dt).name
    dims = red.loop_dims
    full = kb.box("S2", dims, x.shape)

    def at(buffer: str, stmt: str):
        return kb.load(red.write(buffer, stmt, True), dt)

    def out_at(stmt: str):
        return kb.access(out, stmt, dims, dims)

    stmts = red.statements(m, x.name, dt, "max", lambda e: e)
    shifted = kb.binary("sub", red.read(x.name, "S2", dt), at(m, "S2"))
    log = node.op_type == "LogSoftmax"
    stmts.append(Statement("S2", full, out_at("S2"), shifted if log else kb.unary("exp", shifted)))
    stmts += red.statements(
        s, out, dt, "add", (lambda e: kb.unary("exp", e)) if log else (lambda e: e), 3
    )
    y = kb.load(out_at("S5"), dt)
    if log:
        final = kb.binary("sub", y, kb.unary("log", at(s, "S5")))
    else:
        final = kb.binary("div", y, at(s, "S5"))
    stmts.append(Statement("S5", kb.box("S5", dims, x.shape), out_at("S5"), final))
    ctx.kernel(node, stmts)
