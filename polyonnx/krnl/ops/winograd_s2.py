"""3x3 stride-2 Convs by Winograd's minimal filtering over the stride's phases.

Along each axis, output ``o`` reads padded inputs 2o, 2o + 1 and 2o + 2: the even phase
(taps 0 and 2) is a 2-tap stride-1 filter over the even inputs, the odd phase (tap 1) a
1-tap one over the odd inputs. A tile of 4 outputs takes F(4, 2) on its even phase (5
inputs, 5 multiplications for 8) and reads its odd phase as it is (4 for 4). In 2-D the
four phase pairs of a 4x4 tile make 25 + 20 + 20 + 16 = 81 transformed points where the
direct sum does 9 x 16 = 144 multiplications per (output, input) channel pair. As in
krnl/ops/winograd.py, the sum over input channels is one GEMM per point, and three
kernels do the work::

    <node>.winograd_input   P = X zero-padded, each row stored as 4 runs of every 4th
                            column (winograd.split_copy); T = the even rows' F(4, 2)
                            input transform; V[t, c, q] = the columns' one
    <node>                  M[t, m, q] = 0;  M[t, m, q] += U[t, m, c] * V[t, c, q]
    <node>.winograd_output  R = the even columns' output transform of M; Y = B + the
                            rows' output transform of R, summed over the four pairs

over the TY x TX tiles of each image, ``q = (n*TY + ty)*TX + tx``. The odd phases'
transforms are identities, so the passes read those values where they lie. U, the
transformed weights, is computed once when lowering (in float64).

F(4, 2) evaluates at 0, 1, -1, 2 and infinity; the input transform's rows are scaled to
integers (the scale moves into G). Largest errors measured against float64, 128 input
channels of unit-normal data: 1.2e-5 on outputs of scale 1 (tests/krnl/test_winograd_s2.py
checks the lowering against numpy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Statement
from polyonnx.krnl.lower import LowerContext
from polyonnx.krnl.ops.conv import Axis, conv_bias, domain
from polyonnx.krnl.ops.winograd import (
    combination,
    down_columns,
    gemm_kernel,
    plain_3x3,
    split_copy,
    transform_pass,
)

TILE = 4
STEP = 2 * TILE
"""Outputs a tile has along an axis, and the padded inputs it moves along it."""
SPLIT = 4
"""The input's rows are stored as SPLIT runs of every SPLIT-th column: a tile's window
columns are then read along the tiles at a stride of STEP / SPLIT (emit/codegen.py reads
strides up to schedule/heuristics/nest.py's MAX_STRIDE by shuffles); 4 measured faster than
8 or 2 (docs/measurements.md, 'Stride-2 Winograd Convs')."""

BT = np.array(
    [[2, -1, -2, 1, 0], [0, 2, 1, -1, 0], [0, -2, 3, -1, 0], [0, -1, 0, 1, 0], [0, 2, -1, -2, 1]],
    dtype=np.float64,
)
G = np.array(
    [[1 / 2, 0], [1 / 2, 1 / 2], [1 / 6, -1 / 6], [1 / 6, 1 / 3], [0, 1]], dtype=np.float64
)
AT = np.array(
    [[1, 1, 1, 1, 0], [0, 1, -1, 2, 0], [0, 1, 1, 4, 0], [0, 1, -1, 8, 1]], dtype=np.float64
)
"""F(4, 2): ``y = AT ((G g) * (BT d))`` for a 2-tap filter g over 5 inputs d."""


@dataclass(frozen=True, eq=False)
class Phase:
    """One phase of an axis: its taps (every other one from ``first``), the window a
    tile reads (``size`` values, padded input ``STEP*t + first + 2*i`` for the i-th),
    and its transforms (identities for the one-tap odd phase)."""

    first: int
    bt: np.ndarray
    g: np.ndarray
    at: np.ndarray

    @property
    def size(self) -> int:
        return self.bt.shape[0]

    @property
    def identity(self) -> bool:
        return self.bt.shape[0] == TILE


EVEN = Phase(0, BT, G, AT)
ODD = Phase(1, np.eye(TILE), np.ones((TILE, 1)), np.eye(TILE))
PHASES = (EVEN, ODD)
PAIRS = [(a, b) for a in PHASES for b in PHASES]
"""The four (row phase, column phase) pairs, in the order of their points in U, V, M."""
POINTS = sum(a.size * b.size for a, b in PAIRS)

CHANNEL_PAIRS = 128 * 128
"""(Output, input) channel pairs from which a 3x3 stride-2 Conv runs this way rather than
over phases (krnl/ops/phases.py): 128 channels measured faster, 64 slower, on a Zen 5
(docs/measurements.md, 'Stride-2 Winograd Convs')."""
MIN_TILES = 49
"""Tiles an image from which a Conv runs this way: the GEMMs' columns. U is 9 times the
size of the weights, and with few columns the GEMMs' time goes to reading it
(docs/measurements.md, 'Stride-2 Winograd Convs')."""
TILE_WORK = 0.6
"""The most multiplications this way may do per direct one, tiles that stick out of the
output counted whole (81 a tile against 9 an output); at 0.68 it measured within noise
(docs/measurements.md, 'Stride-2 Winograd Convs')."""


def fits(x: Buffer, weights: np.ndarray | None, axes: Sequence[Axis], group: int) -> bool:
    """Whether a Conv runs this way: float32, 2-D, 3x3, stride 2, no dilation, one group,
    pads of at most 1, constant weights, at least CHANNEL_PAIRS channel pairs and
    MIN_TILES tiles an image."""
    if not plain_3x3(x, weights, axes, group, 2):
        return False
    tiles = math.prod(_tiles([a.out for a in axes]))
    work = POINTS * tiles <= TILE_WORK * 9 * math.prod(a.out for a in axes)
    return weights.shape[0] * weights.shape[1] >= CHANNEL_PAIRS and tiles >= MIN_TILES and work


def _tiles(outs: Sequence[int]) -> tuple[int, ...]:
    return tuple(-(-o // TILE) for o in outs)


def first_point(pair: tuple[Phase, Phase]) -> int:
    """The first point of a phase pair."""
    index = PAIRS.index(pair)
    return sum(a.size * b.size for a, b in PAIRS[:index])


def weights_transform(weights: np.ndarray) -> np.ndarray:
    """U[t, m, c] = (G_a g_ab G_b^T)[t] for each pair's taps g_ab of each 3x3 filter:
    [POINTS, M, C] float32 (computed in float64)."""
    w = weights.astype(np.float64)
    blocks = []
    for a, b in PAIRS:
        taps = w[:, :, a.first :: 2, b.first :: 2]
        u = a.g @ taps @ b.g.T  # [M, C, a.size, b.size]
        blocks.append(u.reshape(*w.shape[:2], -1).transpose(2, 0, 1))
    return np.ascontiguousarray(np.concatenate(blocks), np.float32)


def lower(
    ctx: LowerContext, node: Node, x: Buffer, weights: np.ndarray, axes: Sequence[Axis], out: Buffer
) -> None:
    """The three kernels of the module docstring."""
    n, c = x.shape[:2]
    tiles = _tiles([a.out for a in axes])
    columns = n * tiles[0] * tiles[1]
    v = ctx.temp(f"{out.name}.winograd_v", (POINTS, c, columns), "float32")
    _input_kernel(ctx, node, x, axes, v, tiles)
    u = ctx.table(f"{node.inputs[1]}_winograd_s2", weights_transform(weights))
    m = ctx.temp(f"{out.name}.winograd_m", (POINTS, weights.shape[0], columns), "float32")
    gemm_kernel(ctx, node, u, v, m)
    _output_kernel(ctx, node, m, out, tiles)


def _input_kernel(
    ctx: LowerContext, node: Node, x: Buffer, axes: Sequence[Axis], v: Buffer, tiles
) -> None:
    """V down the windows' columns, then along their rows::

    T[n, c, a, vy, r, u] = sum over i of BT[a, i] P[n, c, 8*vy + 2*i, r, u]   (even rows)
    V[t, c, q] = sum over j of BT_b[b, j] S[n, c, a, vy, col % 4, 2*vx + col // 4]

    where P[n, c, y, r, u] holds padded column 4*u + r, col = 2*j + the column phase's
    first tap, and S is T for an even row phase, P's row 8*vy + 2*a + 1 for the odd one.
    """
    ty, tx = tiles
    runs = STEP // SPLIT  # a tile's step in a run
    split_tiles = (runs * ty, runs * tx)  # (split_copy's rows and runs for SPLIT-wide tiles)
    padded, stmts = split_copy(ctx, x, axes, split_tiles, SPLIT, f"{v.name}.padded")
    half = padded.shape[-1]
    t = ctx.temp(f"{v.name}.rows", (*x.shape[:2], EVEN.size, ty, SPLIT, half), x.dtype)
    down_columns(stmts, t, padded, EVEN.bt, lambda i: f"{STEP}*vy + {2 * i}")
    dims = ["pn", "pc", "a", "vy", "vx"]
    q = f"({ty}*pn + vy)*{tx} + vx"
    for rows, cols in PAIRS:
        base = first_point((rows, cols))
        for b in range(cols.size):

            def index(j, rows=rows, cols=cols):
                col = 2 * j + cols.first
                where = [str(col % SPLIT), f"{runs}*vx + {col // SPLIT}"]
                if rows.identity:
                    return ["pn", "pc", f"{STEP}*vy + 2*a + {rows.first}", *where]
                return ["pn", "pc", "a", "vy", *where]

            name = f"S{len(stmts)}"
            stmts.append(
                transform_pass(
                    name,
                    dims,
                    kb.box(name, dims, (*x.shape[:2], rows.size, ty, tx)),
                    kb.access(v.name, name, dims, [f"{base} + {cols.size}*a + {b}", "pc", q]),
                    cols.bt[b],
                    padded if rows.identity else t,
                    index,
                )
            )
    ctx.kernel(node, stmts, ".winograd_input", "WinogradInput")


def _output_kernel(ctx: LowerContext, node: Node, m: Buffer, out: Buffer, tiles) -> None:
    """Y = B + the sum over phase pairs of AT_a M_q AT_b^T, along the tile's rows, then
    down its columns::

    R[n, m, k, ty, dx, tx] = sum over b of AT[dx, b] M[pair's a*5 + b, m, q]   (even columns)
    Y[n, m, 4*ty + dy, 4*tx + dx] = B[m] + sum over pairs and a of AT_a[dy, a] S

    where k numbers the even-column pairs' rows a, and S is R for an even column phase,
    M's point a*4 + dx of the pair for the odd one.
    """
    ty, tx = tiles
    n, channels, oh, ow = out.shape
    evens = [(rows, cols) for rows, cols in PAIRS if not cols.identity]
    first_row = {pair: sum(r.size for r, _ in evens[: evens.index(pair)]) for pair in evens}
    r = ctx.temp(
        f"{out.name}.winograd_rows",
        (n, channels, first_row[evens[-1]] + evens[-1][0].size, TILE, ty, tx),
        "float32",
    )
    dims = ["n", "m", "a", "ty", "tx"]
    q = f"({ty}*n + ty)*{tx} + tx"
    stmts = []
    for pair in evens:
        rows, cols = pair
        base = first_point(pair)
        for dx in range(TILE):
            name = f"S{len(stmts)}"
            stmts.append(
                transform_pass(
                    name,
                    dims,
                    kb.box(name, dims, (n, channels, rows.size, ty, tx)),
                    kb.access(
                        r.name,
                        name,
                        dims,
                        ["n", "m", f"a + {first_row[pair]}", str(dx), "ty", "tx"],
                    ),
                    cols.at[dx],
                    m,
                    lambda b, base=base, size=cols.size: [f"{base} + {size}*a + {b}", "m", q],
                )
            )
    bias = conv_bias(ctx, node, out)
    dims = ["n", "m", "ty", "dx", "tx"]
    for dy in range(TILE):
        name = f"S{len(stmts)}"
        total = _pairs_sum(name, dims, dy, m, r, first_row, q)
        if bias is not None:
            load = kb.load(kb.access(bias.name, name, dims, ["m"]), bias.dtype)
            total = kb.binary("add", total, load)
        inside = [f"{TILE}*ty + {dy} < {oh}", f"{TILE}*tx + dx < {ow}"]
        stmts.append(
            Statement(
                name,
                domain(name, dims, (n, channels, ty, TILE, tx), inside),
                kb.access(out.name, name, dims, ["n", "m", f"{TILE}*ty + {dy}", f"{TILE}*tx + dx"]),
                total,
            )
        )
    ctx.kernel(node, stmts, ".winograd_output", "WinogradOutput")


def _pairs_sum(name: str, dims: list[str], dy: int, m: Buffer, r: Buffer, first_row, q: str):
    """Output row ``dy`` of a tile (at column dx): the sum over phase pairs of their
    rows' output transform, from R (even column phases) or M (odd ones)."""

    def load(buffer: Buffer, index: list[str]):
        return kb.load(kb.access(buffer.name, name, dims, index), buffer.dtype)

    total = None
    for pair in PAIRS:
        rows, cols = pair
        if cols.identity:
            base = first_point(pair)
            term = combination(
                rows.at[dy], lambda a, base=base: load(m, [f"{base} + {TILE * a} + dx", "m", q])
            )
        else:
            first = first_row[pair]
            term = combination(
                rows.at[dy],
                lambda a, first=first: load(r, ["n", "m", str(first + a), "dx", "ty", "tx"]),
            )
        total = term if total is None else kb.binary("add", total, term)
    return total
