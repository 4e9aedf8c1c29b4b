"""Attention (opsets 23-25). RotaryEmbedding, LinearAttention, CausalConvWithState and
Swish, the other ops of the sequence models, have their own files.

Attention is one kernel of contractions and elementwise statements over a scores temp
``W[b, h, i, j]`` (query head ``h``, query ``i``, key ``j``), in float32 (float64 when
the inputs or ``softmax_precision`` are double)::

    present[b, n, p, d]     = past[b, n, p, d]           (past_key/past_value given)
    present[b, n, P + j, d] = K[b, n, j, d]
    W[b, h, i, j]  = 0
    W[b, h, i, j] += Q[b, h, i, d] * K[b, h/R, j, d]       GQA: kv head h/R, R = Hq/Hkv
    W = softcap(scale * W)  (+ mask | mask ? W : -inf)      masked keys: W = -inf
    m = max_j W;  m = (m == -inf ? 0 : m);  W = exp(W - m)
    s = sum_j W;  s = (s == 0 ? 1 : s);     W = W / s        a fully masked row gives 0
    Y[b, h, i, e] = 0;  Y[b, h, i, e] += W[b, h, i, j] * V[b, h/R, j, e]

The query-head loop is split as ``h = R*g + r`` so that the kv head ``g`` is affine (no
floor division); 3-D (batch, seq, heads*size) inputs and outputs are read and written
through access maps (``Q[b, i, D*h + d]``), with no transposed copies. Static masks
(is_causal with its past offset, the opset-25 sliding window, the padding of a short
``attn_mask``) are statements whose domains hold exactly the masked positions
(``{ S[b, h, i, j] : j > i + P }``); ``nonpad_kv_seqlen`` is data, so its per-batch
padding, causal frontier and window are a select on the loaded lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.statements import Nest, Statements, i64, seq_index

Fn = Callable[[Expr], Expr]
DOUBLE = 11  # onnx TensorProto.DOUBLE, for softmax_precision


def _neg_inf(dtype: str) -> Expr:
    return kb.const(-np.inf, dtype)


def _cmp(op: str, a: Expr, b: Expr) -> Expr:
    return kb.binary(op, a, b, "bool")


def _plus(*terms: Expr) -> Expr:
    total = terms[0]
    for term in terms[1:]:
        total = kb.binary("add", total, term)
    return total


@dataclass(frozen=True)
class Geometry:
    """The sizes of one Attention node, with heads and sequences in 4-D terms."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    past: int
    head: int
    v_head: int
    rank3: bool

    @property
    def total(self) -> int:
        return self.past + self.kv_len

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def head_nest(self) -> Nest:
        """The loops over batch and query heads: ``[b, h]``, or ``[b, g, r]`` for GQA."""
        if self.group == 1:
            return Nest(("b", "h"), (self.batch, self.q_heads))
        return Nest(("b", "g", "r"), (self.batch, self.kv_heads, self.group))

    @property
    def q_head(self) -> str:
        return "h" if self.group == 1 else f"{self.group}*g + r"

    @property
    def kv_head(self) -> str:
        return "h" if self.group == 1 else "g"


def _geometry(ctx: LowerContext, node: Node, where: str) -> Geometry:
    q, k, v = (ctx.buffer(node.inputs[i]) for i in range(3))
    rank = len(q.shape)
    if rank not in (3, 4) or len(k.shape) != rank or len(v.shape) != rank:
        raise LoweringError(
            f"{where}: Q, K and V must all be 3-D or all 4-D, got {q.shape}, {k.shape}, {v.shape}"
        )
    q_heads, kv_heads = node.attr("q_num_heads"), node.attr("kv_num_heads")
    if rank == 4:
        if node.opset >= 25 and (q_heads is not None or kv_heads is not None):
            raise LoweringError(f"{where}: q_num_heads/kv_num_heads are only for 3-D inputs")
        if (q_heads, kv_heads) not in ((None, None), (q.shape[1], k.shape[1])):
            raise LoweringError(
                f"{where}: q_num_heads={q_heads}, kv_num_heads={kv_heads} contradict the 4-D "
                f"shapes {q.shape}, {k.shape}"
            )
        batch, q_heads, q_len, head = q.shape
        _, kv_heads, kv_len, k_head = k.shape
        v_heads, v_len, v_head = v.shape[1:]
    else:
        if q_heads is None or kv_heads is None or int(q_heads) <= 0 or int(kv_heads) <= 0:
            raise LoweringError(f"{where}: 3-D inputs need q_num_heads and kv_num_heads > 0")
        q_heads, kv_heads = int(q_heads), int(kv_heads)
        for name, buf, heads in (("Q", q, q_heads), ("K", k, kv_heads), ("V", v, kv_heads)):
            if buf.shape[2] % heads:
                raise LoweringError(
                    f"{where}: {name}'s hidden size {buf.shape[2]} is not a multiple of "
                    f"{heads} heads"
                )
        batch, q_len, head = q.shape[0], q.shape[1], q.shape[2] // q_heads
        kv_len, k_head = k.shape[1], k.shape[2] // kv_heads
        v_heads, v_len, v_head = kv_heads, v.shape[1], v.shape[2] // kv_heads
    if k_head != head or (k.shape[0], v.shape[0]) != (batch, batch):
        raise LoweringError(f"{where}: Q {q.shape} and K {k.shape} do not match")
    if (v_heads, v_len) != (kv_heads, kv_len):
        raise LoweringError(f"{where}: K {k.shape} and V {v.shape} do not match")
    if kv_heads == 0 or q_heads % kv_heads:
        raise LoweringError(
            f"{where}: {q_heads} query heads are not a multiple of {kv_heads} key/value heads"
        )
    past = 0
    if node.input(4) or node.input(5):
        if not (node.input(4) and node.input(5)):
            raise LoweringError(f"{where}: past_key and past_value must be given together")
        if node.input(6):
            raise LoweringError(f"{where}: nonpad_kv_seqlen cannot be used with past_key")
        pk, pv = ctx.buffer(node.input(4)).shape, ctx.buffer(node.input(5)).shape
        past = pk[2] if len(pk) == 4 else -1
        if pk != (batch, kv_heads, past, head) or pv != (batch, kv_heads, past, v_head):
            raise LoweringError(f"{where}: past_key {pk} / past_value {pv} do not match K and V")
    return Geometry(batch, q_heads, kv_heads, q_len, kv_len, past, head, v_head, rank == 3)


@lowers("Attention")
def lower_attention(ctx: LowerContext, node: Node) -> None:
    where = f"Attention node {node.name!r}"
    geo = _geometry(ctx, node, where)
    q, v = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[2])
    if not is_float(q.dtype) or not is_float(v.dtype):
        raise LoweringError(f"{where}: Q/K/V have dtypes {q.dtype}/{v.dtype}; floats are needed")
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise LoweringError(f"{where}: qk_matmul_output_mode {mode} is not 0, 1, 2 or 3")
    wide = node.attr("softmax_precision") == DOUBLE or "float64" in (q.dtype, v.dtype)
    att = AttentionKernel(ctx, node, geo, "float64" if wide else "float32", where)
    att.scores()
    att.bias(mode)
    att.softmax()
    if att.qk_out and mode == 3:
        att.copy_scores()
    att.weighted_sum()
    att.st.emit(ctx, node)


class AttentionKernel:
    """The statements of one Attention node, built in order over the scores temp W."""

    def __init__(self, ctx: LowerContext, node: Node, geo: Geometry, acc: str, where: str):
        self.ctx, self.node, self.geo, self.acc, self.where = ctx, node, geo, acc, where
        self.st = Statements()
        self.q, self.k, self.v = (ctx.buffer(node.inputs[i]) for i in range(3))
        self.t1 = self.q.dtype
        self.rows = geo.head_nest.extend(("i",), (geo.q_len,))
        self.score_nest = self.rows.extend(("j",), (geo.total,))
        shape = (geo.batch, geo.q_heads, geo.q_len, geo.total)
        self.w = ctx.temp(f"{node.outputs[0]}.scores", shape, acc).name
        self.w_index = ["b", geo.q_head, "i", "j"]
        self.qk_out = node.outputs[3] if len(node.outputs) > 3 else ""
        if self.qk_out:
            ctx.output(self.qk_out, shape, self.t1)
        self.keys = self.present(1, self.k.name, geo.head)
        self.values = self.present(2, self.v.name, geo.v_head)

    # -- operands ----------------------------------------------------------------------

    def present(self, slot: int, name: str, size: int) -> str:
        """present_key (slot 1) / present_value (slot 2) = concat(past, K) along the
        sequence, in 4-D; returns the buffer the contractions read K (V) from."""
        geo, node = self.geo, self.node
        out = node.outputs[slot] if len(node.outputs) > slot else ""
        past = node.input(3 + slot)
        if not out and not past:
            return name
        dtype = self.ctx.buffer(name).dtype
        shape = (geo.batch, geo.kv_heads, geo.total, size)
        ctx = self.ctx
        buf = ctx.output(out, shape, dtype) if out else ctx.temp(f"{name}.present", shape, dtype)
        at = ["b", "n", "p", "d"]
        old = Nest(("b", "n", "p", "d"), (geo.batch, geo.kv_heads, geo.past, size))
        if past:
            self.st.add(old, (buf.name, at), lambda s: old.load(past, s, at, dtype))
        new = Nest(("b", "n", "p", "d"), (geo.batch, geo.kv_heads, geo.kv_len, size))
        read = seq_index(geo.rank3, "b", "n", "p", "d", size)
        self.st.add(
            new,
            (buf.name, ["b", "n", f"p + {geo.past}", "d"]),
            lambda s: new.load(name, s, read, dtype),
        )
        return buf.name if past else name

    def kv_index(self, buffer: str, j: str, d: str, size: int) -> list[str]:
        """K or V (4-D present buffer or input) at kv head of the query head, key j."""
        if buffer in (self.k.name, self.v.name):
            return seq_index(self.geo.rank3, "b", self.geo.kv_head, j, d, size)
        return ["b", self.geo.kv_head, j, d]

    def w_load(self, stmt: str, nest: Nest | None = None) -> Expr:
        return (nest or self.score_nest).load(self.w, stmt, self.w_index, self.acc)

    def update(self, body: Callable[[Expr, str], Expr], *where: str) -> None:
        """W = body(W, statement) over the scores, restricted by ``where``."""
        self.st.add(
            self.score_nest, (self.w, self.w_index), lambda s: body(self.w_load(s), s), *where
        )

    def copy_scores(self) -> None:
        write = (self.qk_out, self.w_index)
        self.st.add(self.score_nest, write, lambda s: kb.cast(self.w_load(s), self.t1))

    # -- the stages --------------------------------------------------------------------

    def scores(self) -> None:
        """W = Q K^T, accumulated in the wide type."""
        geo, acc = self.geo, self.acc
        self.st.add(self.score_nest, (self.w, self.w_index), lambda s: kb.const(0, acc))
        nest = self.score_nest.extend(("d",), (geo.head,))
        q_at = seq_index(geo.rank3, "b", geo.q_head, "i", "d", geo.head)
        k_at = self.kv_index(self.keys, "j", "d", geo.head)

        def product(s: str) -> Expr:
            qv = kb.cast(nest.load(self.q.name, s, q_at, self.t1), acc)
            return kb.binary("mul", qv, kb.cast(nest.load(self.keys, s, k_at, self.k.dtype), acc))

        self.st.add(nest, (self.w, self.w_index), product, reduce="add")

    def bias(self, mode: int) -> None:
        """Scale and softcap, then the masks. Pending elementwise work is fused into the
        next statement over W, unless the qk output must see the value in between."""
        acc, want = self.acc, self.qk_out
        scale = kb.const(_scale(self.node, self.geo, self.t1), acc)
        softcap = float(self.node.attr("softcap", 0.0) or 0.0)
        pending: list[Fn] = [lambda x: kb.binary("mul", x, scale)]
        if softcap > 0:
            cap = kb.const(softcap, acc)
            if want and mode == 0:
                self.update(_fused(pending))
                self.copy_scores()
                pending = []
            pending.append(
                lambda x: kb.binary("mul", kb.unary("tanh", kb.binary("div", x, cap)), cap)
            )
        if want and (mode == 1 or (mode == 0 and softcap <= 0)):
            self.update(_fused(pending))
            self.copy_scores()
            pending = []
        if self.node.input(3):
            self.mask(_compose(pending))
        elif pending:
            self.update(_fused(pending))
        self.structure()
        if want and mode == 2:
            self.copy_scores()

    def mask(self, before: Fn) -> None:
        """W = before(W) + mask (float) or mask ? before(W) : -inf (bool) where the mask
        has keys; a mask shorter than the keys masks the rest (ONNX pads it)."""
        geo, acc = self.geo, self.acc
        mask = self.ctx.buffer(self.node.input(3))
        shape, lead = mask.shape, mask.shape[:-1]
        target = (geo.batch, geo.q_heads, geo.q_len)
        try:
            fits = len(shape) <= 4 and kb.broadcast_shape(lead, target) == target
        except ValueError:
            fits = False
        if not fits or (shape and shape[-1] > geo.total):
            raise LoweringError(
                f"{self.where}: attn_mask {shape} does not broadcast to the scores "
                f"{(*target, geo.total)}"
            )
        index = [*kb.broadcast_index(["b", geo.q_head, "i"], lead), *(["j"] if shape else [])]
        keys = shape[-1] if shape else geo.total

        def masked(x: Expr, s: str) -> Expr:
            value = self.score_nest.load(mask.name, s, index, mask.dtype)
            if mask.dtype == "bool":
                return kb.select(value, before(x), _neg_inf(acc))
            return kb.binary("add", before(x), kb.cast(value, acc))

        self.update(masked, f"j < {keys}")
        self.update(lambda x, s: _neg_inf(acc), f"j >= {keys}")

    def structure(self) -> None:
        """is_causal, the sliding window and nonpad_kv_seqlen: query i, at absolute
        position i + offset, sees key j iff j <= i + offset (causal), i + offset - j <=
        left and j - i - offset <= right (window), and j < nonpad[b]. The offset is the
        past length, or nonpad[b] - q_len when the lengths are given."""
        node, geo, acc = self.node, self.geo, self.acc
        causal = bool(int(node.attr("is_causal", 0)))
        left = int(node.attr("left_window_size", -1))
        right = int(node.attr("right_window_size", -1))
        if left < -1 or right < -1:
            raise LoweringError(
                f"{self.where}: window sizes must be -1 or >= 0, got {left}, {right}"
            )
        if not node.input(6):  # a static offset: the masked positions are a domain
            off = geo.past
            for masked, on in (
                (f"j > i + {off}", causal),
                (f"j < i + {off - left}", left >= 0),
                (f"j > i + {off + right}", right >= 0),
            ):
                if on:
                    self.update(lambda x, s: _neg_inf(acc), masked)
            return
        lengths = self.ctx.buffer(node.input(6))
        if lengths.shape != (geo.batch,) or lengths.dtype != "int64":
            raise LoweringError(
                f"{self.where}: nonpad_kv_seqlen must be int64 of shape ({geo.batch},), got "
                f"{lengths.dtype} {lengths.shape}"
            )

        def body(x: Expr, s: str) -> Expr:
            n = self.score_nest.load(lengths.name, s, ["b"], "int64")
            j, q = i64("j"), i64(geo.q_len)
            pos = kb.binary("add", i64("i"), n)  # the query's absolute position + q_len
            conds = [_cmp("lt", j, n)]
            if causal:
                conds.append(_cmp("le", _plus(j, q), pos))
            if left >= 0:
                conds.append(_cmp("le", pos, _plus(j, q, i64(left))))
            if right >= 0:
                conds.append(_cmp("le", _plus(j, q), _plus(pos, i64(right))))
            cond = conds[0]
            for c in conds[1:]:
                cond = kb.binary("and", cond, c, "bool")
            return kb.select(cond, x, _neg_inf(acc))

        self.update(body)

    def softmax(self) -> None:
        """Max-shifted softmax over j; a fully masked row (max -inf) becomes zeros."""
        geo, acc, rows = self.geo, self.acc, self.rows
        row_shape = (geo.batch, geo.q_heads, geo.q_len)
        m = self.ctx.temp(f"{self.node.outputs[0]}.max", row_shape, acc).name
        total = self.ctx.temp(f"{self.node.outputs[0]}.sum", row_shape, acc).name
        row = ["b", geo.q_head, "i"]

        def at(buffer: str, s: str, nest: Nest = rows) -> Expr:
            return nest.load(buffer, s, row, acc)

        def replace(buffer: str, bad: Expr, good: Expr) -> None:
            self.st.add(
                rows,
                (buffer, row),
                lambda s: kb.select(_cmp("eq", at(buffer, s), bad), good, at(buffer, s)),
            )

        self.st.add(rows, (m, row), lambda s: _neg_inf(acc))
        self.st.add(self.score_nest, (m, row), self.w_load, reduce="max")
        replace(m, _neg_inf(acc), kb.const(0, acc))
        self.update(lambda x, s: kb.unary("exp", kb.binary("sub", x, at(m, s, self.score_nest))))
        self.st.add(rows, (total, row), lambda s: kb.const(0, acc))
        self.st.add(self.score_nest, (total, row), self.w_load, reduce="add")
        replace(total, kb.const(0, acc), kb.const(1, acc))
        self.update(lambda x, s: kb.binary("div", x, at(total, s, self.score_nest)))

    def weighted_sum(self) -> None:
        """Y = W V, in the wide type, then rounded to T1 if that is narrower."""
        geo, acc = self.geo, self.acc
        y_shape = (
            (geo.batch, geo.q_len, geo.q_heads * geo.v_head)
            if geo.rank3
            else (geo.batch, geo.q_heads, geo.q_len, geo.v_head)
        )
        y = self.ctx.output(self.node.outputs[0], y_shape, self.t1).name
        outs = self.rows.extend(("e",), (geo.v_head,))
        y_at = seq_index(geo.rank3, "b", geo.q_head, "i", "e", geo.v_head)
        target = y if acc == self.t1 else self.ctx.temp(f"{y}.acc", y_shape, acc).name
        self.st.add(outs, (target, y_at), lambda s: kb.const(0, acc))
        nest = outs.extend(("j",), (geo.total,))
        v_at = self.kv_index(self.values, "j", "e", geo.v_head)

        def product(s: str) -> Expr:
            vv = kb.cast(nest.load(self.values, s, v_at, self.v.dtype), acc)
            return kb.binary("mul", self.w_load(s, nest), vv)

        self.st.add(nest, (target, y_at), product, reduce="add")
        if target != y:
            self.st.add(
                outs, (y, y_at), lambda s: kb.cast(outs.load(target, s, y_at, acc), self.t1)
            )


def _compose(fns: Sequence[Fn]) -> Fn:
    def apply(x: Expr) -> Expr:
        for fn in fns:
            x = fn(x)
        return x

    return apply


def _fused(fns: Sequence[Fn]) -> Callable[[Expr, str], Expr]:
    composed = _compose(list(fns))
    return lambda x, s: composed(x)


def _scale(node: Node, geo: Geometry, t1: str) -> float:
    """scale as the reference applies it: Q and K each times sqrt(scale) rounded to T1."""
    scale = node.attr("scale")
    scale = 1 / np.sqrt(geo.head) if scale is None else float(scale)
    root = float(np.dtype(t1).type(np.sqrt(scale)))
    return root * root
