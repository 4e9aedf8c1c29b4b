"""Swish (opset 24)."""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.elementwise import elementwise


@lowers("Swish")
def lower_swish(ctx: LowerContext, node: Node) -> None:
    """x * sigmoid(alpha * x); float16 through float32."""
    alpha = float(node.attr("alpha", 1.0))

    def body(xs: list[Expr]) -> Expr:
        x = xs[0]
        if not is_float(x.dtype):
            raise LoweringError(f"Swish node {node.name!r}: input has dtype {x.dtype}")
        wide = kb.cast(x, "float64" if x.dtype == "float64" else "float32")
        scaled = kb.binary("mul", kb.const(alpha, wide.dtype), wide)
        return kb.cast(kb.binary("mul", wide, kb.unary("sigmoid", scaled)), x.dtype)

    elementwise(ctx, node, node.inputs[:1], body)
