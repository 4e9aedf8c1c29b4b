"""Ops that only re-index: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout.

Each output is a *view*: the input's storage under another shape, with no copy and no
kernel (row-major data is unchanged by these ops).
"""

from __future__ import annotations

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Statement
from polyonnx.krnl.lower import LowerContext, lowers


@lowers("Identity")
def lower_identity(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    ctx.view(node.outputs[0], x.name, x.shape)


@lowers("Dropout")
def lower_dropout(ctx: LowerContext, node: Node) -> None:
    """Inference: the output is the input; the optional mask is all true. Training mode
    (random masks) is refused rather than silently run as inference."""
    training = node.input(2) and bool(ctx.require_constant(node, 2, "training_mode").reshape(-1)[0])
    ratio = float(ctx.require_constant(node, 1, "ratio").reshape(-1)[0]) if node.input(1) else 0.5
    if training and ratio != 0.0:
        raise LoweringError(
            f"Dropout node {node.name!r} runs in training mode (random masks); polyonnx "
            "compiles inference only"
        )
    x = ctx.buffer(node.inputs[0])
    ctx.view(node.outputs[0], x.name, x.shape)
    if len(node.outputs) > 1 and node.outputs[1]:
        dims = kb.dims("d", len(x.shape))
        mask = ctx.output(node.outputs[1], x.shape, "bool")
        write = kb.access(mask.name, "S0", dims, dims)
        stmt = Statement("S0", kb.box("S0", dims, x.shape), write, kb.const(True, "bool"))
        ctx.kernel(node, [stmt])


@lowers("Reshape")
def lower_reshape(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    target = [int(v) for v in ctx.require_constant(node, 1, "shape").reshape(-1)]
    allowzero = int(node.attr("allowzero", 0))
    shape = [x.shape[i] if (v == 0 and not allowzero) else v for i, v in enumerate(target)]
    if shape.count(-1) > 1:
        raise LoweringError(f"Reshape node {node.name!r}: more than one -1 in {target}")
    if -1 in shape:
        known = int(np.prod([v for v in shape if v != -1], dtype=np.int64))
        total = int(np.prod(x.shape, dtype=np.int64))
        if known == 0 or total % known:
            raise LoweringError(f"Reshape node {node.name!r}: cannot reshape {x.shape} to {target}")
        shape[shape.index(-1)] = total // known
    if int(np.prod(shape, dtype=np.int64)) != x.size or any(v < 0 for v in shape):
        raise LoweringError(f"Reshape node {node.name!r}: cannot reshape {x.shape} to {target}")
    ctx.view(node.outputs[0], x.name, shape)


@lowers("Flatten")
def lower_flatten(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    axis, rank = int(node.attr("axis", 1)), len(x.shape)
    if not -rank <= axis <= rank:
        raise LoweringError(
            f"Flatten node {node.name!r}: axis {axis} is out of range for rank {rank} "
            f"(valid: {-rank}..{rank})"
        )
    axis = axis + rank if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    ctx.view(node.outputs[0], x.name, (lead, int(np.prod(x.shape[axis:], dtype=np.int64))))


@lowers("Squeeze")
def lower_squeeze(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    axes = _axes(ctx, node, 13)
    rank = len(x.shape)
    if axes is None:
        axes = [a for a, n in enumerate(x.shape) if n == 1]
    axes = kb.normalize_axes(axes, rank, f"Squeeze node {node.name!r}")
    for a in axes:
        if x.shape[a] != 1:
            raise LoweringError(f"Squeeze node {node.name!r}: dim {a} of {x.shape} is not 1")
    ctx.view(node.outputs[0], x.name, [n for a, n in enumerate(x.shape) if a not in axes])


@lowers("Unsqueeze")
def lower_unsqueeze(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    axes = _axes(ctx, node, 13) or []
    rank = len(x.shape) + len(axes)
    axes = kb.normalize_axes(axes, rank, f"Unsqueeze node {node.name!r}")
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    ctx.view(node.outputs[0], x.name, shape)


def _axes(ctx: LowerContext, node: Node, input_since: int) -> list[int] | None:
    if node.opset >= input_since:
        if not node.input(1):
            return None
        return [int(a) for a in ctx.require_constant(node, 1, "axes").reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]
