"""Compile-time operands shared by op families: a one-element input whose value the
lowering needs (Range's start/limit/delta, Trilu's k, OneHot's depth, a window's size, DFT's
length…).

No op lowers here; the families import what they need.
"""

from __future__ import annotations

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl.lower import LowerContext


def constant_scalar(ctx: LowerContext, node: Node, index: int, what: str) -> np.ndarray:
    """The value of input ``index`` of ``node`` (``what`` names it in errors) as a 0-d
    array: it must be a compile-time constant with exactly one element."""
    value = np.asarray(ctx.require_constant(node, index, what))
    if value.size != 1:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: {what} must have one element, has shape "
            f"{value.shape}"
        )
    return value.reshape(())
