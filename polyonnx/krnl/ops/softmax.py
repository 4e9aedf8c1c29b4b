"""Softmax and LogSoftmax as max-shifted reductions over the normalised axes.

Opset >= 13 normalises over one axis (default -1); older opsets coerce the input to 2-D
at ``axis`` (default 1) and normalise over every trailing dim::

    Softmax                              LogSoftmax
    m = max x           (over the axes)  m = max x
    y = exp(x - m)                       s = sum exp(x - m)
    s = 1 / sum y                        s = log(s)
    y = y * s                            y = (x - m) - s

The max need not propagate NaN (``max_nnan``, one vmaxps a step): a NaN in a row makes
its sum NaN, so every output of that row is NaN whatever the max. Softmax stores each exp
once and multiplies by the reciprocal of the sum; LogSoftmax never stores ``x - m``: it
recomputes it in the last statement.

When the normalised axis is the innermost one and long (at least ``2 * LANES_BLOCK``),
the max and the sum are two-stage: ``LANES_BLOCK`` partial results per row, element
``r`` of the row going to partial ``r mod LANES_BLOCK``, then one reduction of the
partials. The partials are the vector lanes of the first stage, so it runs several
independent vector accumulators instead of one serial chain::

    p[k, l] = max(p[k, l], x[k, B*c + l])        0 <= l < B, 0 <= B*c + l < n
    m[k, 0] = max(m[k, 0], p[k, l])
"""

from __future__ import annotations

from collections.abc import Callable

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Statement
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.reduce import Reduction, identity

Update = Callable[[Expr, Callable[[str], Expr]], Expr]
"""A reduction's summand from (the loaded element, a loader of per-row statistics)."""

LANES_BLOCK = 64
"""Partials per row in the two-stage reductions: 4 AVX-512 vectors (8 AVX2 ones)."""


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
    stmts: list[Statement] = []

    def name() -> str:
        return f"S{len(stmts)}"

    def at(buffer: str, stmt: str) -> Expr:
        return kb.load(red.write(buffer, stmt, True), dt)

    def full(fn: Callable[[str], Expr], target: str) -> None:
        """``target[..] = fn(stmt)`` at every point of x."""
        stmt = name()
        write = kb.access(target, stmt, dims, dims)
        stmts.append(Statement(stmt, kb.box(stmt, dims, x.shape), write, fn(stmt)))

    def reduce(target: str, source: str, op: str, update: Update) -> None:
        stmts.extend(_reduction(ctx, red, target, source, dt, op, update, len(stmts)))

    def shifted(stmt: str) -> Expr:
        return kb.binary("sub", red.read(x.name, stmt, dt), at(m, stmt))

    reduce(m, x.name, "max_nnan", lambda e, _: e)
    if node.op_type == "LogSoftmax":
        reduce(s, x.name, "add", lambda e, row: kb.unary("exp", kb.binary("sub", e, row(m))))
        stmts.append(red.finish(s, name(), dt, lambda e: kb.unary("log", e)))
        full(lambda stmt: kb.binary("sub", shifted(stmt), at(s, stmt)), out)
    else:
        full(lambda stmt: kb.unary("exp", shifted(stmt)), out)
        reduce(s, out, "add", lambda e, _: e)
        stmts.append(red.finish(s, name(), dt, lambda e: kb.unary("reciprocal", e)))
        full(lambda stmt: kb.binary("mul", red.read(out, stmt, dt), at(s, stmt)), out)
    ctx.kernel(node, stmts)


def _reduction(
    ctx: LowerContext,
    red: Reduction,
    target: str,
    source: str,
    dtype: str,
    op: str,
    update: Update,
    first: int,
) -> list[Statement]:
    """Init and update statements reducing ``update(source[..], stmt)`` into ``target``;
    two-stage through ``LANES_BLOCK`` partials per row where that pays (see above)."""
    rank = len(red.shape)
    n = red.shape[-1] if rank else 0
    if red.axes != (rank - 1,) or n < 2 * LANES_BLOCK:
        return _plain(red, target, source, dtype, op, update, first)
    lead = [f"d{a}" for a in range(rank - 1)]
    lane = red.loop_dims[-1]  # the row's own dim name: every statement's SIMD loop is one name
    partial = ctx.temp(target + ".part", (*red.shape[:-1], LANES_BLOCK), dtype).name
    s_init, s_upd = f"S{first}", f"S{first + 1}"
    kept = [*lead, lane]
    box = kb.box(s_init, kept, (*red.shape[:-1], LANES_BLOCK))
    init = Statement(s_init, box, kb.access(partial, s_init, kept, kept), identity(op, dtype))
    loop = [*lead, "c", lane]
    bounds = [f"0 <= {d} < {size}" for d, size in zip(lead, red.shape, strict=False)]
    bounds += [f"0 <= {lane} < {LANES_BLOCK}", f"0 <= {LANES_BLOCK} * c + {lane} < {n}"]
    domain = f"{{ {s_upd}[{', '.join(loop)}] : {' and '.join(bounds)} }}"
    read = kb.load(kb.access(source, s_upd, loop, [*lead, f"{LANES_BLOCK} * c + {lane}"]), dtype)
    write = kb.access(partial, s_upd, loop, kept)
    row_index = [*lead, "0"]

    def row(buffer: str) -> Expr:
        return kb.load(kb.access(buffer, s_upd, loop, row_index), dtype)

    upd = Statement(s_upd, domain, write, update(read, row), op)
    second = Reduction((*red.shape[:-1], LANES_BLOCK), red.axes, keepdims=True)
    return [init, upd, *second.statements(target, partial, dtype, op, lambda e: e, first + 2)]


def _plain(
    red: Reduction,
    target: str,
    source: str,
    dtype: str,
    op: str,
    update: Update,
    first: int,
) -> list[Statement]:
    s_upd = f"S{first + 1}"

    def row(buffer: str) -> Expr:
        return kb.load(red.write(buffer, s_upd, True), dtype)

    return red.statements(target, source, dtype, op, lambda e: update(e, row), first)
