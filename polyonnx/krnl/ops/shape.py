"""Shape and Size: after shape specialisation every shape is known when lowering, so their
outputs are constants (usually the frontend folds them first; this covers what shape
inference could not type, e.g. before a model's symbolic dims are pinned)."""

from __future__ import annotations

import numpy as np

from polyonnx.frontend.graph import Node
from polyonnx.krnl.lower import LowerContext, lowers


@lowers("Shape")
def lower_shape(ctx: LowerContext, node: Node) -> None:
    shape = ctx.buffer(node.inputs[0]).shape
    rank = len(shape)
    start, end = int(node.attr("start", 0)), node.attr("end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    stop = rank if end is None else int(end)
    stop = min(max(stop + rank if stop < 0 else stop, 0), rank)
    ctx.constant_output(node.outputs[0], np.array(shape[start:stop], dtype=np.int64))


@lowers("Size")
def lower_size(ctx: LowerContext, node: Node) -> None:
    size = int(np.prod(ctx.buffer(node.inputs[0]).shape, dtype=np.int64))
    ctx.constant_output(node.outputs[0], np.array(size, dtype=np.int64))
