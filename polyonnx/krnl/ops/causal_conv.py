"""CausalConvWithState (opset 27): a depthwise causal conv1d that carries its state."""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.statements import Nest, Statements


@lowers("CausalConvWithState")
def lower_causal_conv_with_state(ctx: LowerContext, node: Node) -> None:
    """A depthwise causal conv1d over the sequence ``past_state ++ x`` (zeros without a
    past), read in place: each tap reads the past where ``l + k < K - 1`` and the input
    elsewhere, two reductions over domains split by that constraint (no padded copy)::

        Y[b, c, l]  = bias[c]
        Y[b, c, l] += w[c, 0, k] * past[b, c, l + k]            l + k <  K - 1
        Y[b, c, l] += w[c, 0, k] * x[b, c, l + k - (K - 1)]     l + k >= K - 1
        Y = Y * sigmoid(Y)                                       (silu / swish)
        present[b, c, s] = the last K - 1 positions of past ++ x
    """
    where = f"CausalConvWithState node {node.name!r}"
    x, w = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    activation = node.attr("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise LoweringError(f"{where}: activation {activation!r} is not none, silu or swish")
    if len(x.shape) != 3 or not is_float(x.dtype):
        raise LoweringError(f"{where}: input must be a 3-D float tensor, got {x.dtype} {x.shape}")
    batch, channels, length = x.shape
    if len(w.shape) != 3 or w.shape[:2] != (channels, 1) or w.shape[2] < 1:
        raise LoweringError(f"{where}: weight {w.shape} should be ({channels}, 1, kernel size)")
    taps = w.shape[2]
    carry = taps - 1
    past = node.input(3)
    if past and ctx.buffer(past).shape != (batch, channels, carry):
        raise LoweringError(
            f"{where}: past_state {ctx.buffer(past).shape} should be {(batch, channels, carry)}"
        )
    bias = node.input(2)
    if bias and ctx.buffer(bias).shape != (channels,):
        raise LoweringError(f"{where}: bias {ctx.buffer(bias).shape} should be ({channels},)")
    acc = "float64" if x.dtype == "float64" else "float32"
    y = ctx.output(node.outputs[0], x.shape, x.dtype).name
    y_acc = y if acc == x.dtype else ctx.temp(f"{y}.acc", x.shape, acc).name
    out = Nest(("b", "c", "l"), x.shape)
    conv = out.extend(("k",), (taps,))
    y_at = ["b", "c", "l"]
    st = Statements()

    def read(nest: Nest, buf: str, s: str, index: list[str]) -> Expr:
        return kb.cast(nest.load(buf, s, index, ctx.buffer(buf).dtype), acc)

    st.add(out, (y_acc, y_at), lambda s: read(out, bias, s, ["c"]) if bias else kb.const(0, acc))
    for source, offset, side in ((past, 0, "<"), (x.name, -carry, ">=")):
        if not source:
            continue

        def tap(s: str, source: str = source, offset: int = offset) -> Expr:
            value = read(conv, source, s, ["b", "c", f"l + k + {offset}"])
            return kb.binary("mul", read(conv, w.name, s, ["c", "0", "k"]), value)

        st.add(conv, (y_acc, y_at), tap, f"l + k {side} {carry}", reduce="add")
    if activation != "none":
        st.add(
            out,
            (y_acc, y_at),
            lambda s: kb.binary(
                "mul",
                out.load(y_acc, s, y_at, acc),
                kb.unary("sigmoid", out.load(y_acc, s, y_at, acc)),
            ),
        )
    if y_acc != y:
        st.add(out, (y, y_at), lambda s: kb.cast(out.load(y_acc, s, y_at, acc), x.dtype))
    present = node.outputs[1] if len(node.outputs) > 1 else ""
    if present:
        dtype = ctx.buffer(past).dtype if past else x.dtype
        ctx.output(present, (batch, channels, carry), dtype)
        keep = Nest(("b", "c", "s"), (batch, channels, carry))
        at = ["b", "c", "s"]
        old = (
            (lambda s: keep.load(past, s, ["b", "c", f"s + {length}"], dtype))
            if past
            else (lambda s: kb.const(0, dtype))
        )
        st.add(keep, (present, at), old, f"s + {length} < {carry}")
        st.add(
            keep,
            (present, at),
            lambda s: kb.cast(
                keep.load(x.name, s, ["b", "c", f"s + {length - carry}"], x.dtype), dtype
            ),
            f"s + {length} >= {carry}",
        )
    st.emit(ctx, node)
