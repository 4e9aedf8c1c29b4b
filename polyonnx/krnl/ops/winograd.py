"""3x3 stride-1 Convs by Winograd's minimal filtering, F(2x2, 3x3) or F(4x4, 3x3).

Each s x s block of outputs (a tile; s = 2 or 4) is computed from the w x w input window
around it (w = s + 2) with w^2 multiplications per (output, input) channel pair instead of
9 s^2: the window and the 3x3 filter are carried into a transformed space where the
convolution is an elementwise product, summed over input channels, then carried back.
The sum over channels is w^2 independent GEMMs, one per point ``t`` of the transformed
tile, which take the register-blocked GEMM micro-kernel like any batched MatMul. Three
kernels, each transform done along one side of the window at a time (``_input_kernel``,
``_output_kernel``)::

    <node>.winograd_input   P = X zero-padded to s*TY + 2 rows, s*TX + 2 columns
                            V[t, c, q] = (BT P_q BT^T)[t]
    <node>                  M[t, m, q] = 0;  M[t, m, q] += U[t, m, c] * V[t, c, q]
    <node>.winograd_output  Y[n, m, s*ty + dy, s*tx + dx] = B[m] + (AT M_q AT^T)[dy, dx]

over the TY x TX tiles of each image, ``q = (n*TY + ty)*TX + tx``, P_q the w x w window
of P at (s*ty, s*tx). U = G g G^T, the transformed weights, is computed once when
lowering (in float64). F(2x2)'s BT and AT hold 0 and +-1 and G +-1/2, so its results
differ from the direct sum by rounding only; F(4x4)'s hold up to 5 and 8 and G 1/24, so
its error is some ten to twenty times that, as other Winograd implementations accept:
largest errors 3e-5 to 1e-4 on outputs of scale 5 at 64 to 512 channels, against F(2x2)'s
2e-6 to 5e-6 (both are checked against numpy in tests/krnl/test_winograd.py). It does
36 multiplications for 16 outputs where F(2x2) does 64: on planes of F4_PLANE outputs a
side and more. The GEMM kernel keeps the node's name: a schedule script or the tuner
that picks the node's Conv gets its contraction. The transforms' passes share the batch and channel
dims, so the default schedule runs each transform kernel a channel at a time
(TRANSFORMS in schedule/heuristics/default.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Access, Buffer, Expr, Statement
from polyonnx.krnl.lower import LowerContext
from polyonnx.krnl.ops.conv import Axis, conv_bias, domain


@dataclass(frozen=True)
class Variant:
    """F(m x m, 3x3): tiles of ``tile`` x ``tile`` outputs from windows of tile + 2
    inputs; ``bt``, ``g`` and ``at`` carry a window, a filter and a transformed tile."""

    tile: int
    bt: np.ndarray
    g: np.ndarray
    at: np.ndarray

    @property
    def window(self) -> int:
        return self.tile + 2

    def tiles(self, outs: Sequence[int]) -> tuple[int, ...]:
        """Tiles along each output axis of ``outs`` outputs (the last may stick out)."""
        return tuple(-(-o // self.tile) for o in outs)


F2 = Variant(
    2,
    np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64),
    np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64),
    np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64),
)
F4 = Variant(
    4,
    np.array(
        [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        dtype=np.float64,
    ),
    np.array(
        [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ],
        dtype=np.float64,
    ),
    np.array(
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
        dtype=np.float64,
    ),
)

F4_PLANE = 16
F4_CHANNEL_PAIRS = 64 * 64
"""Output size a side and channel pairs from which a Conv takes F(4x4, 3x3): smaller
outputs have too few tiles for its GEMMs (512 -> 512 at 7x7 is a GEMM of 4 columns).
Measured on a Zen 3 (docs/measurements.md, 'F(4x4, 3x3) from 16 outputs a side and 64 x
64 channel pairs')."""

CHANNEL_PAIRS = 64 * 128
"""(Output, input) channel pairs from which a 3x3 Conv takes F(2x2, 3x3): below, the
two transforms (passes over 4x the input's and output's bytes) cost what the GEMMs save
(docs/measurements.md, 'F(2x2, 3x3) from 64 x 128 channel pairs')."""

TILE_WORK = 0.6
"""The most multiplications a Winograd Conv may do per direct one: w^2 a tile against 9 an
output, tiles that stick out of an odd-sized output counted whole. F(2x2) on a 7x7 output
(16 tiles for 49 outputs) does 0.58 and measured 0.69 of onnxruntime's time at 512 channels;
a 5x5 one would do 0.64, a 3x3 one 0.79."""


def plain_3x3(
    x: Buffer, weights: np.ndarray | None, axes: Sequence[Axis], group: int, stride: int
) -> bool:
    """Whether a Conv is float32, 2-D, 3x3 with ``stride``, no dilation, one group, pads of
    at most 1 and constant weights: what a Winograd lowering takes."""
    if weights is None or x.dtype != "float32" or group != 1 or len(axes) != 2:
        return False
    if not all(a.kernel == 3 and a.stride == stride and a.dilation == 1 for a in axes):
        return False
    return all(a.pad <= 1 and a.pad_end <= 1 for a in axes)


def fits(x: Buffer, weights: np.ndarray | None, axes: Sequence[Axis], group: int) -> Variant | None:
    """The variant this Conv runs by, or None: float32, 2-D, 3x3, stride and dilation 1,
    one group, pads of at most 1, constant weights, at least CHANNEL_PAIRS channel pairs,
    and at most TILE_WORK multiplications per direct one; F4 from F4_PLANE outputs a side
    and F4_CHANNEL_PAIRS pairs."""
    if not plain_3x3(x, weights, axes, group, 1):
        return None
    oh, ow = (a.out for a in axes)
    pairs = weights.shape[0] * weights.shape[1]
    for variant, least_pairs, least_side in (
        (F4, F4_CHANNEL_PAIRS, F4_PLANE),
        (F2, CHANNEL_PAIRS, 1),
    ):
        tiles = math.prod(variant.tiles((oh, ow)))
        work = variant.window**2 * tiles <= TILE_WORK * 9 * oh * ow
        if pairs >= least_pairs and min(oh, ow) >= least_side and work:
            return variant
    return None


def weights_transform(weights: np.ndarray, variant: Variant) -> np.ndarray:
    """U[t, m, c] = (G g G^T)[t] for each 3x3 filter g = W[m, c]: [window^2, M, C]
    float32 (computed in float64)."""
    u = variant.g @ weights.astype(np.float64) @ variant.g.T  # [M, C, window, window]
    points = variant.window**2
    return np.ascontiguousarray(
        u.reshape(*weights.shape[:2], points).transpose(2, 0, 1), np.float32
    )


def transform_pass(
    name: str, dims: list[str], where: str, write: Access, coeffs: np.ndarray, src: Buffer, index
) -> Statement:
    """One pass of a transform: ``write = sum over i of coeffs[i] * src[index(i)]`` over
    the domain ``where``."""

    def load(i: int) -> Expr:
        return kb.load(kb.access(src.name, name, dims, index(i)), src.dtype)

    return Statement(name, where, write, combination(coeffs, load))


def combination(coeffs: np.ndarray, load) -> Expr:
    """``sum over i of coeffs[i] * load(i)``, the nonzero terms only (+-1 as an add or a
    subtract)."""
    total = None
    for i, k in enumerate(coeffs):
        if k == 0:
            continue
        term = load(i)
        if abs(k) != 1:
            term = kb.binary("mul", kb.const(float(abs(k)), "float32"), term)
        if total is None:
            total = term if k > 0 else kb.unary("neg", term)
        else:
            total = kb.binary("add" if k > 0 else "sub", total, term)
    return total


def lower(
    ctx: LowerContext,
    node: Node,
    x: Buffer,
    weights: np.ndarray,
    axes: Sequence[Axis],
    out: Buffer,
    variant: Variant,
) -> None:
    """The three kernels of the module docstring."""
    n, c = x.shape[:2]
    tiles = variant.tiles([a.out for a in axes])
    columns = n * tiles[0] * tiles[1]
    points = variant.window**2
    v = ctx.temp(f"{out.name}.winograd_v", (points, c, columns), "float32")
    _input_kernel(ctx, node, x, axes, v, tiles, variant)
    u = ctx.table(f"{node.inputs[1]}_winograd", weights_transform(weights, variant))
    m = ctx.temp(f"{out.name}.winograd_m", (points, weights.shape[0], columns), "float32")
    gemm_kernel(ctx, node, u, v, m)
    _output_kernel(ctx, node, m, out, tiles, variant)


def _input_kernel(
    ctx: LowerContext, node: Node, x: Buffer, axes: Sequence[Axis], v: Buffer, tiles, variant
) -> None:
    """V = BT P_q BT^T, down the window's columns, then along its rows::

    T[n, c, a, vy, r, u] = sum over i of BT[a, i] P[n, c, s*vy + i, r, u]
    V[a*w + b, c, q] = sum over j of BT[b, j] T[n, c, a, vy, j % s, vx + j // s]
    """
    ty, tx = tiles
    s, w = variant.tile, variant.window
    padded, stmts = split_copy(ctx, x, axes, tiles, s, f"{v.name}.padded")
    half = padded.shape[-1]
    t = ctx.temp(f"{v.name}.columns", (*x.shape[:2], w, ty, s, half), x.dtype)
    down_columns(stmts, t, padded, variant.bt, lambda i: f"{s}*vy + {i}")
    dims = ["pn", "pc", "a", "vy", "vx"]
    q = f"({ty}*pn + vy)*{tx} + vx"
    for b in range(w):
        name = f"S{len(stmts)}"
        stmts.append(
            transform_pass(
                name,
                dims,
                kb.box(name, dims, (x.shape[0], x.shape[1], w, ty, tx)),
                kb.access(v.name, name, dims, [f"{w}*a + {b}", "pc", q]),
                variant.bt[b],
                t,
                lambda j: ["pn", "pc", "a", "vy", str(j % s), f"vx + {j // s}"],
            )
        )
    ctx.kernel(node, stmts, ".winograd_input", "WinogradInput")


def down_columns(stmts: list[Statement], t: Buffer, padded: Buffer, bt: np.ndarray, row) -> None:
    """Append the input transform's passes down the windows' columns, one per row ``a``
    of ``bt``: ``T[n, c, a, vy, r, u] = sum over i of bt[a, i] P[n, c, row(i), r, u]``
    over T's (vy, r, u), where ``row(i)`` is the padded row of a window's i-th (in vy)."""
    dims = ["pn", "pc", "vy", "r", "u"]  # the copy's batch and channel dims
    box = (*t.shape[:2], *t.shape[3:])
    for a in range(bt.shape[0]):
        name = f"S{len(stmts)}"
        stmts.append(
            transform_pass(
                name,
                dims,
                kb.box(name, dims, box),
                kb.access(t.name, name, dims, ["pn", "pc", str(a), "vy", "r", "u"]),
                bt[a],
                padded,
                lambda i: ["pn", "pc", row(i), "r", "u"],
            )
        )


def split_copy(
    ctx: LowerContext, x: Buffer, axes: Sequence[Axis], tiles, s: int, hint: str
) -> tuple[Buffer, list[Statement]]:
    """X zero-padded to s*TY + 2 rows of s*TX + 2 columns, each row stored as s runs of
    every s-th column: P[n, c, y, r, u] holds padded column s*u + r. A tile's window
    column j is then P[.., j % s, tx + j // s], contiguous along the tiles, where the
    padded row itself would be read every s-th column::

        S0: P[n, c, y, r, u] = 0                         (the pad cells only)
        S1: P[n, c, y + top, r, u] = X[n, c, y, s*u + r - left]
    """
    (h, top), (w, left) = ((a.size, a.pad) for a in axes)
    rows, half = s * tiles[0] + 2, tiles[1] + 1
    shape = (*x.shape[:2], rows, s, half)
    src = ctx.temp(hint, shape, x.dtype)
    dims = ["pn", "pc", "y", "r", "u"]
    column = f"{s}*u + r - {left}"
    pad = f"(y < {top} or y >= {top + h} or {column} < 0 or {column} >= {w})"
    pad_cells = Statement(
        "S0",
        domain("S0", dims, shape, [pad]),
        kb.access(src.name, "S0", dims, dims),
        kb.const(0, x.dtype),
    )
    copy = Statement(
        "S1",
        domain("S1", dims, (*x.shape[:2], h, s, half), [f"0 <= {column} < {w}"]),
        kb.access(src.name, "S1", dims, ["pn", "pc", f"y + {top}", "r", "u"]),
        kb.load(kb.access(x.name, "S1", dims, ["pn", "pc", "y", column]), x.dtype),
    )
    return src, [pad_cells, copy]


def gemm_kernel(ctx: LowerContext, node: Node, u: Buffer, v: Buffer, m: Buffer) -> None:
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


def _output_kernel(ctx: LowerContext, node: Node, m: Buffer, out: Buffer, tiles, variant) -> None:
    """Y = B + AT M_q AT^T, along the tile's rows, then down its columns::

    R[n, m, a, ty, dx, tx] = sum over b of AT[dx, b] M[a*w + b, m, q]
    Y[n, m, s*ty + dy, s*tx + dx] = B[m] + sum over a of AT[dy, a] R[n, m, a, ty, dx, tx]
    """
    ty, tx = tiles
    s, w = variant.tile, variant.window
    n, channels, oh, ow = out.shape
    bias = conv_bias(ctx, node, out)
    r = ctx.temp(f"{out.name}.winograd_rows", (n, channels, w, ty, s, tx), "float32")
    dims = ["n", "m", "a", "ty", "tx"]
    q = f"({ty}*n + ty)*{tx} + tx"
    stmts = []
    for dx in range(s):
        name = f"S{len(stmts)}"
        stmts.append(
            transform_pass(
                name,
                dims,
                kb.box(name, dims, (n, channels, w, ty, tx)),
                kb.access(r.name, name, dims, ["n", "m", "a", "ty", str(dx), "tx"]),
                variant.at[dx],
                m,
                lambda b: [f"{w}*a + {b}", "m", q],
            )
        )
    dims = ["n", "m", "ty", "dx", "tx"]
    for dy in range(s):
        name = f"S{len(stmts)}"
        inside = [f"{s}*ty + {dy} < {oh}", f"{s}*tx + dx < {ow}"]
        stmt = transform_pass(
            name,
            dims,
            domain(name, dims, (n, channels, ty, s, tx), inside),
            kb.access(out.name, name, dims, ["n", "m", f"{s}*ty + {dy}", f"{s}*tx + dx"]),
            variant.at[dy],
            r,
            lambda a: ["n", "m", str(a), "ty", "dx", "tx"],
        )
        if bias is not None:
            b = kb.load(kb.access(bias.name, name, dims, ["m"]), bias.dtype)
            stmt = dataclasses.replace(stmt, expr=kb.binary("add", stmt.expr, b))
        stmts.append(stmt)
    ctx.kernel(node, stmts, ".winograd_output", "WinogradOutput")
