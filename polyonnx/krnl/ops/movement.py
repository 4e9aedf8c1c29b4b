"""Tensor movement: Concat, Split, Slice, Transpose, Expand, Tile, DepthToSpace, SpaceToDepth.

Nothing is computed; every op is a copy whose read or write index is an affine map:

- Concat writes input ``k`` into its slab of the output (one statement per input, the
  write index offset along the axis by the sizes before it); Split is the mirror image,
  one statement per output in one kernel. Where a slab is a contiguous block (every dim
  before the axis of extent 1: a batch-1 channel Concat) and the input is a tensor only
  this Concat stores, that input is instead stored inside the output (Program.slices):
  its producer writes the slab directly and nothing is copied.
- Slice reads at ``start + step * i`` (steps may be negative); Transpose is a permuted read;
  Expand a broadcast read.
- Tile and the depth/space shuffles would need ``i mod n`` or ``floor(i / n)`` in the read
  index; instead their domains get one extra dim per split axis, so that both the read
  and the write stay affine (``out[t*n + i] = x[i]`` over ``0 <= t < repeats, 0 <= i < n``)
  and the copies vectorise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Statement
from polyonnx.krnl.lower import LowerContext, lowers


def copy_statement(
    name: str,
    out: str,
    src: str,
    dtype: str,
    dims: Sequence[str],
    domain: str,
    write: Sequence[str],
    read: Sequence[str],
) -> Statement:
    """``out[write] = src[read]`` over ``domain`` (index expressions over ``dims``)."""
    body = kb.load(kb.access(src, name, dims, read), dtype)
    return Statement(name, domain, kb.access(out, name, dims, write), body)


def emit(ctx: LowerContext, node: Node, statements: list[Statement]) -> None:
    """Add the kernel, unless every statement's domain was empty (a zero-size output)."""
    if statements:
        ctx.kernel(node, statements)


def read_copy(ctx: LowerContext, node: Node, x: Buffer, out: Buffer, read: Sequence[str]) -> None:
    """The kernel ``out[d..] = x[read]`` over ``out``'s box, with ``read`` over the dims
    ``d0, d1, ..`` (Slice's strided, Transpose's permuted, Expand's broadcast read); no
    kernel for a zero-size output."""
    if not out.size:
        return
    dims = kb.dims("d", len(out.shape))
    domain = kb.box("S0", dims, out.shape)
    ctx.kernel(node, [copy_statement("S0", out.name, x.name, x.dtype, dims, domain, dims, read)])


def _axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: axis {axis} is out of range for rank {rank}"
        )
    return axis % max(rank, 1)


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


# ---- Concat and Split ----------------------------------------------------------------


@lowers("Concat")
def lower_concat(ctx: LowerContext, node: Node) -> None:
    parts = [ctx.buffer(name) for name in node.inputs if name]
    rank = len(parts[0].shape)
    axis = _axis(node, int(node.attr("axis", 0)), rank)
    off_axis = {tuple(n for r, n in enumerate(p.shape) if r != axis) for p in parts}
    if any(len(p.shape) != rank for p in parts) or len(off_axis) > 1:
        raise LoweringError(
            f"Concat node {node.name!r}: shapes {[p.shape for p in parts]} differ off axis {axis}"
        )
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    dtype = parts[0].dtype
    out = ctx.output(node.outputs[0], shape, dtype)
    dims = kb.dims("d", rank)
    statements: list[Statement] = []
    offset = 0
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    in_place = all(n == 1 for n in shape[:axis])  # each part a contiguous block of out
    for part in parts:
        if in_place and _written_in_place(ctx, node, part.name):
            ctx.store_inside(part.name, out.name, offset * inner)
        elif part.size:
            name = f"S{len(statements)}"
            write = list(dims)
            write[axis] = f"{dims[axis]} + {offset}"
            domain = kb.box(name, dims, part.shape)
            statements.append(
                copy_statement(name, out.name, part.name, dtype, dims, domain, write, dims)
            )
        offset += part.shape[axis]
    emit(ctx, node, statements)


def _written_in_place(ctx: LowerContext, node: Node, name: str) -> bool:
    """Whether a Concat's part can be computed straight into the output (the copy then
    disappears): a tensor a kernel of the model writes, once in this Concat, and in no
    other storage (not a graph input, output or constant, no view or part of another
    Concat). Its storage then lives as long as the output's."""
    graph = ctx.graph
    if (
        name in graph.constants
        or name in ctx.constants
        or any(v.name == name for v in (*graph.inputs, *graph.outputs))
        or node.inputs.count(name) != 1
    ):
        return False
    viewed = name in ctx.views or name in ctx.views.values() or name in ctx.slices
    written = any(name in k.writes() for k in ctx.kernels) or any(
        container == name for container, _ in ctx.slices.values()
    )  # a Concat's output whose parts were all written in place
    return written and not viewed and ctx.buffers[name].dtype in IN_PLACE_DTYPES


IN_PLACE_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")
"""Element types whose parts are placed by byte offsets (whole bytes per element)."""


@lowers("Split")
def lower_split(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    axis = _axis(node, int(node.attr("axis", 0)), rank)
    sizes = _split_sizes(ctx, node, x.shape[axis])
    dims = kb.dims("d", rank)
    statements: list[Statement] = []
    offset = 0
    for name, size in zip(node.outputs, sizes, strict=True):
        shape = list(x.shape)
        shape[axis] = size
        if name:
            out = ctx.output(name, shape, x.dtype)
            if out.size:
                stmt = f"S{len(statements)}"
                read = list(dims)
                read[axis] = f"{dims[axis]} + {offset}"
                domain = kb.box(stmt, dims, shape)
                statements.append(
                    copy_statement(stmt, name, x.name, x.dtype, dims, domain, dims, read)
                )
        offset += size
    emit(ctx, node, statements)


def _split_sizes(ctx: LowerContext, node: Node, n: int) -> list[int]:
    """The size of every output along the axis, from ``split`` (an attribute before
    opset 13, an input since), ``num_outputs`` (opset 18) or an equal division."""
    count = len(node.outputs)
    if node.opset < 13:
        split = node.attr("split")
    else:
        split = ctx.require_constant(node, 1, "split") if node.input(1) else None
    if split is not None and len(_ints(split)):
        sizes = _ints(split)
        if len(sizes) != count or sum(sizes) != n or min(sizes) < 0:
            raise LoweringError(
                f"Split node {node.name!r}: split {sizes} does not divide a dim of {n} into "
                f"{count} outputs"
            )
        return sizes
    if node.opset >= 18 and node.attr("num_outputs") is not None:
        parts = int(node.attr("num_outputs"))
        if parts != count:
            raise LoweringError(
                f"Split node {node.name!r}: num_outputs={parts} but the node has {count} outputs"
            )
        chunk = -(-n // parts)
        return [max(0, min(chunk, n - i * chunk)) for i in range(parts)]
    if n % count:
        raise LoweringError(
            f"Split node {node.name!r}: a dim of {n} does not split into {count} equal parts"
        )
    return [n // count] * count


# ---- Slice ---------------------------------------------------------------------------


@lowers("Slice")
def lower_slice(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    starts, ends, axes, steps = _slice_args(ctx, node, rank)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise LoweringError(
            f"Slice node {node.name!r}: starts {starts}, ends {ends}, axes {axes} and steps "
            f"{steps} differ in length"
        )
    first, step = [0] * rank, [1] * rank
    shape = list(x.shape)
    seen: set[int] = set()
    for start, end, axis, stride in zip(starts, ends, axes, steps, strict=True):
        axis = _axis(node, axis, rank)
        if axis in seen:
            raise LoweringError(f"Slice node {node.name!r}: axis {axis} is sliced twice")
        seen.add(axis)
        if stride == 0:
            raise LoweringError(f"Slice node {node.name!r}: a step of 0 on axis {axis}")
        first[axis], step[axis], shape[axis] = slice_range(start, end, stride, x.shape[axis])
    out = ctx.output(node.outputs[0], shape, x.dtype)
    dims = kb.dims("d", rank)
    read = [
        f"{b} + {s}*{d}" if s != 1 or b else d for d, b, s in zip(dims, first, step, strict=True)
    ]
    read_copy(ctx, node, x, out, read)


def slice_range(start: int, end: int, step: int, n: int) -> tuple[int, int, int]:
    """(first index, step, count) of ONNX's slice of a dim of size ``n``: negative
    starts/ends count from the end, then they are clamped into [0, n] for positive steps
    and [-1, n - 1] for negative ones."""
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
        count = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, -1), n - 1), min(max(end, -1), n - 1)
        count = max(0, -(-(start - end) // -step))
    return (start if count else 0), step, count


def _slice_args(ctx: LowerContext, node: Node, rank: int):
    if node.opset < 10:
        starts, ends = _ints(node.attr("starts", ())), _ints(node.attr("ends", ()))
        axes = node.attr("axes")
        axes = _ints(axes) if axes is not None else list(range(len(starts)))
        return starts, ends, axes, [1] * len(starts)
    starts = _ints(ctx.require_constant(node, 1, "starts"))
    ends = _ints(ctx.require_constant(node, 2, "ends"))
    axes = _ints(ctx.require_constant(node, 3, "axes")) if node.input(3) else None
    steps = _ints(ctx.require_constant(node, 4, "steps")) if node.input(4) else None
    axes = list(range(len(starts))) if axes is None else axes
    return starts, ends, axes, [1] * len(starts) if steps is None else steps


# ---- Transpose and Expand ------------------------------------------------------------


@lowers("Transpose")
def lower_transpose(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    perm = node.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [p % max(rank, 1) for p in _ints(perm)]
    if sorted(perm) != list(range(rank)):
        raise LoweringError(f"Transpose node {node.name!r}: perm {perm} is not a permutation")
    shape = [x.shape[p] for p in perm]
    out = ctx.output(node.outputs[0], shape, x.dtype)
    dims = kb.dims("d", rank)
    read = [""] * rank
    for r, p in enumerate(perm):
        read[p] = dims[r]
    read_copy(ctx, node, x, out, read)


@lowers("Expand")
def lower_expand(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    target = _ints(ctx.require_constant(node, 1, "shape"))
    try:
        shape = kb.broadcast_shape(x.shape, target)
    except ValueError as exc:
        raise LoweringError(f"Expand node {node.name!r}: {exc}") from exc
    out = ctx.output(node.outputs[0], shape, x.dtype)
    dims = kb.dims("d", len(shape))
    read = kb.broadcast_index(dims, x.shape)
    read_copy(ctx, node, x, out, read)


# ---- Tile ----------------------------------------------------------------------------


@lowers("Tile")
def lower_tile(ctx: LowerContext, node: Node) -> None:
    """``out[t*n + i] = x[i]`` with a tile dim ``t`` for each repeated axis."""
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    repeats = _ints(ctx.require_constant(node, 1, "repeats"))
    if len(repeats) != rank or min(repeats, default=0) < 0:
        raise LoweringError(
            f"Tile node {node.name!r}: repeats {repeats} do not fit an input of shape {x.shape}"
        )
    shape = [n * r for n, r in zip(x.shape, repeats, strict=True)]
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if not out.size:
        return
    loop: list[str] = []
    sizes: list[int] = []
    write: list[str] = []
    read = kb.dims("i", rank)
    for r, (n, times) in enumerate(zip(x.shape, repeats, strict=True)):
        if times > 1:
            loop.append(f"t{r}")
            sizes.append(times)
            write.append(f"{n}*t{r} + i{r}")
        else:
            write.append(f"i{r}")
        loop.append(f"i{r}")
        sizes.append(n)
    domain = kb.box("S0", loop, sizes)
    ctx.kernel(node, [copy_statement("S0", out.name, x.name, x.dtype, loop, domain, write, read)])


# ---- DepthToSpace and SpaceToDepth ---------------------------------------------------


@lowers("DepthToSpace", "SpaceToDepth")
def lower_depth_space(ctx: LowerContext, node: Node) -> None:
    """Over ``(b, c, h, i, w, j)`` with ``i, j`` the position inside a block: the spatial
    index is ``h*bs + i`` and the depth index ``(i*bs + j)*C + c`` (DCR) or
    ``(c*bs + i)*bs + j`` (CRD), with ``C`` the depth of the space side."""
    x = ctx.buffer(node.inputs[0])
    bs = int(node.attr("blocksize", 0))
    mode = node.attr("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if len(x.shape) != 4 or bs < 1 or mode not in ("DCR", "CRD"):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: needs a 4-D input, blocksize >= 1 and mode DCR "
            f"or CRD (got shape {x.shape}, blocksize {bs}, mode {mode})"
        )
    batch, depth, height, width = x.shape
    to_space = node.op_type == "DepthToSpace"
    if to_space and depth % (bs * bs):
        raise LoweringError(
            f"DepthToSpace node {node.name!r}: depth {depth} is not a multiple of {bs}*{bs}"
        )
    if not to_space and (height % bs or width % bs):
        raise LoweringError(
            f"SpaceToDepth node {node.name!r}: spatial dims {x.shape[2:]} are not multiples of {bs}"
        )
    if to_space:
        c, h, w = depth // (bs * bs), height, width
        shape = [batch, c, h * bs, w * bs]
    else:
        c, h, w = depth, height // bs, width // bs
        shape = [batch, c * bs * bs, h, w]
    loop = ["b", "c", "h", "i", "w", "j"]
    domain = kb.box("S0", loop, [batch, c, h, bs, w, bs])
    space = ["b", "c", f"{bs}*h + i", f"{bs}*w + j"]
    channel = f"({bs}*i + j)*{c} + c" if mode == "DCR" else f"({bs}*c + i)*{bs} + j"
    depth_index = ["b", channel, "h", "w"]
    write, read = (space, depth_index) if to_space else (depth_index, space)
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if out.size:
        stmt = copy_statement("S0", out.name, x.name, x.dtype, loop, domain, write, read)
        ctx.kernel(node, [stmt])
