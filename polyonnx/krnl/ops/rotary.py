"""RotaryEmbedding (opset 23)."""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, LoadAt, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.statements import Nest, Statements, i64, seq_index


@lowers("RotaryEmbedding")
def lower_rotary_embedding(ctx: LowerContext, node: Node) -> None:
    """Rotate pairs (x1, x2) of each head by the angle of the token's position::

        out1 = cos * x1 - sin * x2        pairs: (k, k + half), or (2k, 2k + 1) interleaved
        out2 = sin * x1 + cos * x2        out[rd:] = x[rd:]   (partial rotation)

    over loops [b, h, s, k < half]; cos/sin are read at [b, s, k], or at
    [position_ids[b, s], k] (a LoadAt) when position ids are given.
    """
    where = f"RotaryEmbedding node {node.name!r}"
    x, cos, sin = (ctx.buffer(node.inputs[i]) for i in range(3))
    if not is_float(x.dtype):
        raise LoweringError(f"{where}: input has dtype {x.dtype}; floats are needed")
    rank3 = len(x.shape) == 3
    if rank3:
        heads = int(node.attr("num_heads", 0) or 0)
        if heads <= 0 or x.shape[2] % heads:
            raise LoweringError(
                f"{where}: a 3-D input {x.shape} needs num_heads dividing its hidden size"
            )
        batch, seq, size = x.shape[0], x.shape[1], x.shape[2] // heads
    elif len(x.shape) == 4:
        batch, heads, seq, size = x.shape
    else:
        raise LoweringError(f"{where}: input must be 3-D or 4-D, got {x.shape}")
    rot = int(node.attr("rotary_embedding_dim", 0) or 0) or size
    if rot % 2 or rot > size:
        raise LoweringError(f"{where}: rotary_embedding_dim {rot} must be even and <= {size}")
    half = rot // 2
    position = node.input(3)
    want = "(max_position + 1, half)" if position else "(batch, seq, half)"
    for name, cache in (("cos_cache", cos), ("sin_cache", sin)):
        if not cache.shape or cache.shape[-1] != half or len(cache.shape) != (2 if position else 3):
            raise LoweringError(f"{where}: {name} {cache.shape} should be {want} with half={half}")
    wide = "float64" if x.dtype == "float64" else "float32"
    nest = Nest(("b", "h", "s", "k"), (batch, heads, seq, half))
    interleaved = bool(int(node.attr("interleaved", 0)))
    first, second = ("2*k", "2*k + 1") if interleaved else ("k", f"k + {half}")

    def at(d: str) -> list[str]:
        return seq_index(rank3, "b", "h", "s", d, size)

    def table(cache: str, dtype: str, s: str) -> Expr:
        if not position:
            index = kb.broadcast_index(["b", "s", "k"], ctx.buffer(cache).shape)
            return kb.cast(nest.load(cache, s, index, dtype), wide)
        pos_buf = ctx.buffer(position)
        pos = nest.load(position, s, kb.broadcast_index(["b", "s"], pos_buf.shape), pos_buf.dtype)
        return kb.cast(LoadAt(dtype, cache, (kb.cast(pos, "int64"), i64("k"))), wide)

    def rotated(s: str, real: bool) -> Expr:
        x1 = kb.cast(nest.load(x.name, s, at(first), x.dtype), wide)
        x2 = kb.cast(nest.load(x.name, s, at(second), x.dtype), wide)
        c, n = table(cos.name, cos.dtype, s), table(sin.name, sin.dtype, s)
        if real:
            value = kb.binary("sub", kb.binary("mul", c, x1), kb.binary("mul", n, x2))
        else:
            value = kb.binary("add", kb.binary("mul", n, x1), kb.binary("mul", c, x2))
        return kb.cast(value, x.dtype)

    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    st = Statements()
    st.add(nest, (out, at(first)), lambda s: rotated(s, True))
    st.add(nest, (out, at(second)), lambda s: rotated(s, False))
    rest = Nest(("b", "h", "s", "k"), (batch, heads, seq, size - rot))
    st.add(rest, (out, at(f"k + {rot}")), lambda s: rest.load(x.name, s, at(f"k + {rot}"), x.dtype))
    st.emit(ctx, node)
