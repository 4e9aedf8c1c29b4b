"""CumProd (opset 26): the running product along one axis.

The same triangular reduction as CumSum (krnl/ops/scan.py), with ``mul``: the output
position ``i`` along the axis multiplies every input position ``j`` on its side of it::

    S0: y[.., i, ..] = 1
    S1: y[.., i, ..] *= x[.., j, ..]    over 0 <= j <= i       (exclusive: j < i;
                                                                reverse: i <= j < n)

n(n+1)/2 multiplications per line instead of n, but no loop-carried recurrence: every
output element is independent. ``exclusive`` starts each line with the empty product, 1.
"""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers


@lowers("CumProd")
def lower_cumprod(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    where = f"CumProd node {node.name!r}"
    axis_value = ctx.require_constant(node, 1, "axis")
    if axis_value.size != 1:
        raise LoweringError(f"{where}: axis must be a scalar, got shape {axis_value.shape}")
    if rank == 0:
        raise LoweringError(f"{where}: the input must have rank >= 1")
    axis = kb.normalize_axis(int(axis_value.reshape(()).item()), rank, where)
    if not (is_float(x.dtype) or x.dtype.startswith(("int", "uint"))):
        raise LoweringError(f"{where}: dtype {x.dtype} is not supported")
    exclusive, reverse = int(node.attr("exclusive", 0)), int(node.attr("reverse", 0))
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    if not x.size:
        return
    n = x.shape[axis]
    dims = kb.dims("d", rank)
    i = dims[axis]
    write = kb.access(out, "S0", dims, dims)
    init = Statement("S0", kb.box("S0", dims, x.shape), write, kb.const(1, x.dtype))

    full = [*dims, "j"]
    first, second = (i, "j") if reverse else ("j", i)
    bounds = [f"0 <= {d} < {size}" for d, size in zip(dims, x.shape, strict=True)]
    bounds += [f"0 <= j < {n}", f"{first} {'<' if exclusive else '<='} {second}"]
    domain = f"{{ S1[{', '.join(full)}] : {' and '.join(bounds)} }}"
    read = [("j" if r == axis else d) for r, d in enumerate(dims)]
    body = kb.load(kb.access(x.name, "S1", full, read), x.dtype)
    update = Statement("S1", domain, kb.access(out, "S1", full, dims), body, "mul")
    ctx.kernel(node, [init, update])
