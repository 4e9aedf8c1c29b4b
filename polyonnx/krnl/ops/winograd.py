"""3x3 stride-1 Convs by Winograd's minimal filtering, F(2x2, 3x3).

Each 2x2 block of outputs (a tile) is computed from the 4x4 input window around it with
16 multiplications per (output, input) channel pair instead of 36: the window and the
3x3 filter are carried into a transformed space where the convolution is an elementwise
product, summed over input channels, then carried back. The sum over channels is 16
independent GEMMs, one per point ``t`` of the transformed 4x4 tile, which take the
register-blocked GEMM micro-kernel like any batched MatMul. Three kernels::

    <node>.winograd_input   P[n, c, i, j] = X zero-padded to 2*TY + 2 rows, 2*TX + 2 columns
                            V[t, c, q] = (BT P_q BT^T)[t]      (16 stmts, 4 terms each)
    <node>                  M[t, m, q] = 0;  M[t, m, q] += U[t, m, c] * V[t, c, q]
    <node>.winograd_output  Y[n, m, 2*ty + dy, 2*tx + dx] = B[m] + (AT M_q AT^T)[dy, dx]

over the TY x TX tiles of each image, ``q = (n*TY + ty)*TX + tx``, P_q the 4x4 window of
P at (2*ty, 2*tx). U = G g G^T, the transformed weights, is computed once when lowering.
BT and AT hold 0 and +-1 and G +-1/2, so results differ from the direct sum by rounding
only (the same order of error; checked against numpy in tests/krnl/test_winograd.py).
The GEMM kernel keeps the node's name: a schedule script or the tuner that picks the
node's Conv gets its contraction. The input transform's passes share the copy's batch and
channel dims, so the default schedule runs the kernel a channel at a time (TRANSFORMS in
schedule/default.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Expr, Statement
from polyonnx.krnl.lower import LowerContext
from polyonnx.krnl.ops.conv import Axis, conv_bias, domain, padded_copy

BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)

CHANNEL_PAIRS = 64 * 128
"""(Output, input) channel pairs from which a 3x3 Conv takes Winograd's path: below, the
two transforms (passes over 4x the input's and output's bytes) cost what the GEMMs save.
Measured 1 thread, per layer, ratio to onnxruntime, direct -> Winograd: 64 -> 64 at
56x56 1.03 -> 1.03 (another run 0.98 -> 0.86; light ResNet-50 alike with or without its
three), 64 -> 128 at 56 1.00 -> 0.82, 128 -> 64 at 56 1.00 -> 0.84, 128 -> 128 at 28
1.00 -> 0.79, 256 -> 256 at 14 1.08 -> 0.72, 512 -> 512 at 7 0.92 -> 0.69, 256 -> 256
at 56 1.12 -> 0.65, 128 -> 128 at 112 1.07 -> 0.76, 64 -> 128 at 112 1.08 -> 0.90."""

TILE_WORK = 0.6
"""The most multiplications a Winograd Conv may do per direct one: 16 a tile against 9 an
output, tiles that stick out of an odd-sized output counted whole. A 7x7 output (16
tiles for 49 outputs) does 0.58 and measured 0.69 of onnxruntime's time at 512 channels;
a 5x5 one would do 0.64, a 3x3 one 0.79."""


def fits(x: Buffer, weights: np.ndarray | None, axes: Sequence[Axis], group: int) -> bool:
    """Whether this Conv runs by F(2x2, 3x3): float32, 2-D, 3x3, stride and dilation 1,
    one group, pads of at most 1, constant weights, at least CHANNEL_PAIRS channel pairs,
    and at most TILE_WORK multiplications per direct one."""
    if weights is None or x.dtype != "float32" or group != 1 or len(axes) != 2:
        return False
    if not all(a.kernel == 3 and a.stride == 1 and a.dilation == 1 for a in axes):
        return False
    if not all(a.pad <= 1 and a.pad_end <= 1 for a in axes):
        return False
    oh, ow = (a.out for a in axes)
    tiles = -(-oh // 2) * -(-ow // 2)
    pairs = weights.shape[0] * weights.shape[1]
    return pairs >= CHANNEL_PAIRS and 16 * tiles <= TILE_WORK * 9 * oh * ow


def weights_transform(weights: np.ndarray) -> np.ndarray:
    """U[t, m, c] = (G g G^T)[t] for each 3x3 filter g = W[m, c]: [16, M, C] float32
    (computed in float64)."""
    u = G @ weights.astype(np.float64) @ G.T  # [M, C, 4, 4]
    return np.ascontiguousarray(u.reshape(*weights.shape[:2], 16).transpose(2, 0, 1), np.float32)


def _tile_sum(left: np.ndarray, right: np.ndarray, load) -> Expr:
    """``sum over (i, j) of left[i] * right[j] * load(i, j)`` for coefficients of 0 and
    +-1 (one row of BT or AT each side): adds and subtracts of the nonzero terms only."""
    pairs = [(i, j) for i in range(len(left)) for j in range(len(right)) if left[i] * right[j]]
    plus = [load(i, j) for i, j in pairs if left[i] * right[j] > 0]
    minus = [load(i, j) for i, j in pairs if left[i] * right[j] < 0]
    total = plus[0] if plus else kb.unary("neg", minus.pop(0))
    for e in plus[1:]:
        total = kb.binary("add", total, e)
    for e in minus:
        total = kb.binary("sub", total, e)
    return total


def lower(
    ctx: LowerContext, node: Node, x: Buffer, weights: np.ndarray, axes: Sequence[Axis], out: Buffer
) -> None:
    """The three kernels of the module docstring."""
    n, c = x.shape[:2]
    oh, ow = (a.out for a in axes)
    ty, tx = -(-oh // 2), -(-ow // 2)
    v = ctx.temp(f"{out.name}.winograd_v", (16, c, n * ty * tx), "float32")
    _input_kernel(ctx, node, x, axes, v, (ty, tx))
    u = ctx.table(f"{node.inputs[1]}_winograd", weights_transform(weights))
    m = ctx.temp(f"{out.name}.winograd_m", (16, weights.shape[0], n * ty * tx), "float32")
    _gemm_kernel(ctx, node, u, v, m)
    _output_kernel(ctx, node, m, out, (ty, tx))


def _input_kernel(
    ctx: LowerContext, node: Node, x: Buffer, axes: Sequence[Axis], v: Buffer, tiles
) -> None:
    ty, tx = tiles
    # the padded copy spans every tile's window: 2*T + 2 rows and columns
    wide = [
        Axis(a.size, 3, 1, 1, a.pad, a.pad_end, 2 * t) for a, t in zip(axes, tiles, strict=True)
    ]
    padded, stmts = padded_copy(
        ctx, x, wide, kb.const(0, x.dtype), f"{v.name}.padded", flat=False, lead=("pn", "pc")
    )
    dims = ["pn", "pc", "vy", "vx"]  # the copy's batch and channel dims
    q = f"({ty}*pn + vy)*{tx} + vx"
    for t in range(16):
        name = f"S{len(stmts)}"
        a, b = divmod(t, 4)

        def window(i: int, j: int, name: str = name) -> Expr:
            index = ["pn", "pc", f"2*vy + {i}", f"2*vx + {j}"]
            return kb.load(kb.access(padded.name, name, dims, index), x.dtype)

        stmts.append(
            Statement(
                name,
                kb.box(name, dims, (x.shape[0], x.shape[1], ty, tx)),
                kb.access(v.name, name, dims, [str(t), "pc", q]),
                _tile_sum(BT[a], BT[b], window),
            )
        )
    ctx.kernel(node, stmts, ".winograd_input", "WinogradInput")


def _gemm_kernel(ctx: LowerContext, node: Node, u: Buffer, v: Buffer, m: Buffer) -> None:
    """``M[t, i, j] += U[t, i, k] * V[t, k, j]``: a batched MatMul."""
    dims = ["t", "i", "j", "k"]
    init = Statement(
        "S0",
        kb.box("S0", dims[:3], m.shape),
        kb.access(m.name, "S0", dims[:3], dims[:3]),
        kb.const(0, m.dtype),
    )
    product = kb.binary(
        "mul",
        kb.load(kb.access(u.name, "S1", dims, ["t", "i", "k"]), u.dtype),
        kb.load(kb.access(v.name, "S1", dims, ["t", "k", "j"]), v.dtype),
    )
    update = Statement(
        "S1",
        kb.box("S1", dims, (*m.shape, u.shape[2])),
        kb.access(m.name, "S1", dims, dims[:3]),
        product,
        "add",
    )
    ctx.kernel(node, [init, update])


def _output_kernel(ctx: LowerContext, node: Node, m: Buffer, out: Buffer, tiles) -> None:
    ty, tx = tiles
    oh, ow = out.shape[2:]
    bias = conv_bias(ctx, node, out)
    dims = ["n", "m", "ty", "tx"]
    q = f"({ty}*n + ty)*{tx} + tx"
    stmts = []
    for dy in range(2):
        for dx in range(2):
            name = f"S{len(stmts)}"

            def product(a: int, b: int, name: str = name) -> Expr:
                return kb.load(kb.access(m.name, name, dims, [str(4 * a + b), "m", q]), m.dtype)

            value = _tile_sum(AT[dy], AT[dx], product)
            if bias is not None:
                b = kb.load(kb.access(bias.name, name, dims, ["m"]), bias.dtype)
                value = kb.binary("add", value, b)
            inside = [f"2*ty + {dy} < {oh}", f"2*tx + {dx} < {ow}"]
            stmts.append(
                Statement(
                    name,
                    domain(name, dims, (out.shape[0], out.shape[1], ty, tx), inside),
                    kb.access(out.name, name, dims, ["n", "m", f"2*ty + {dy}", f"2*tx + {dx}"]),
                    value,
                )
            )
    ctx.kernel(node, stmts, ".winograd_output", "WinogradOutput")
