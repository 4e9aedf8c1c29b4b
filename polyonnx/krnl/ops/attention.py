"""Attention (opsets 23-25), RotaryEmbedding (23), LinearAttention and CausalConvWithState
(27), and Swish (24).

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
from polyonnx.krnl.ir import Access, Expr, Iter, LoadAt, Statement, is_float
from polyonnx.krnl.islutil import parse_set
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.elementwise import elementwise

Fn = Callable[[Expr], Expr]
DOUBLE = 11  # onnx TensorProto.DOUBLE, for softmax_precision


@dataclass(frozen=True)
class Nest:
    """A loop nest: named dims and their extents."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]

    def domain(self, stmt: str, *where: str) -> str:
        """``{ stmt[dims] : 0 <= dim < size and ... and where }``."""
        bounds = [f"0 <= {d} < {n}" for d, n in zip(self.dims, self.shape, strict=True)]
        head = f"{stmt}[{', '.join(self.dims)}]"
        constraints = " and ".join([*bounds, *where])
        return f"{{ {head} : {constraints} }}" if constraints else f"{{ {head} }}"

    def at(self, buffer: str, stmt: str, index: Sequence[str]) -> Access:
        return kb.access(buffer, stmt, self.dims, index)

    def load(self, buffer: str, stmt: str, index: Sequence[str], dtype: str) -> Expr:
        return kb.load(self.at(buffer, stmt, index), dtype)

    def extend(self, dims: Sequence[str], shape: Sequence[int]) -> Nest:
        return Nest((*self.dims, *dims), (*self.shape, *shape))


class Statements:
    """Statements of one kernel, named S0, S1, … in order."""

    def __init__(self) -> None:
        self.list: list[Statement] = []

    @property
    def next(self) -> str:
        return f"S{len(self.list)}"

    def add(
        self,
        nest: Nest,
        write: tuple[str, Sequence[str]],
        expr: Callable[[str], Expr],
        *where: str,
        reduce: str | None = None,
    ) -> None:
        """``write = expr`` over ``nest`` restricted by ``where``; skipped when empty."""
        name = self.next
        domain = nest.domain(name, *where)
        if parse_set(domain).is_empty():
            return
        self.list.append(
            Statement(name, domain, nest.at(write[0], name, write[1]), expr(name), reduce)
        )

    def emit(self, ctx: LowerContext, node: Node) -> None:
        """The node's kernel; none when every domain was empty (zero-size outputs)."""
        if self.list:
            ctx.kernel(node, self.list)


def _seq_index(rank3: bool, b: str, h: str, s: str, d: str, size: int) -> list[str]:
    """Where element [b, h, s, d] of a logical (batch, heads, seq, head_size) tensor lives:
    the tensor itself, or a 3-D (batch, seq, heads*head_size) one."""
    return [b, s, f"{size}*({h}) + {d}"] if rank3 else [b, h, s, d]


def _neg_inf(dtype: str) -> Expr:
    return kb.const(-np.inf, dtype)


def _cmp(op: str, a: Expr, b: Expr) -> Expr:
    return kb.binary(op, a, b, "bool")


def _i64(value: int | str) -> Expr:
    return Iter("int64", value) if isinstance(value, str) else kb.const(value, "int64")


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
        read = _seq_index(geo.rank3, "b", "n", "p", "d", size)
        self.st.add(
            new,
            (buf.name, ["b", "n", f"p + {geo.past}", "d"]),
            lambda s: new.load(name, s, read, dtype),
        )
        return buf.name if past else name

    def kv_index(self, buffer: str, j: str, d: str, size: int) -> list[str]:
        """K or V (4-D present buffer or input) at kv head of the query head, key j."""
        if buffer in (self.k.name, self.v.name):
            return _seq_index(self.geo.rank3, "b", self.geo.kv_head, j, d, size)
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
        q_at = _seq_index(geo.rank3, "b", geo.q_head, "i", "d", geo.head)
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
            j, q = _i64("j"), _i64(geo.q_len)
            pos = kb.binary("add", _i64("i"), n)  # the query's absolute position + q_len
            conds = [_cmp("lt", j, n)]
            if causal:
                conds.append(_cmp("le", _plus(j, q), pos))
            if left >= 0:
                conds.append(_cmp("le", pos, _plus(j, q, _i64(left))))
            if right >= 0:
                conds.append(_cmp("le", _plus(j, q), _plus(pos, _i64(right))))
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
        y_at = _seq_index(geo.rank3, "b", geo.q_head, "i", "e", geo.v_head)
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


# ---- RotaryEmbedding ------------------------------------------------------------------


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
        return _seq_index(rank3, "b", "h", "s", d, size)

    def table(cache: str, dtype: str, s: str) -> Expr:
        if not position:
            index = kb.broadcast_index(["b", "s", "k"], ctx.buffer(cache).shape)
            return kb.cast(nest.load(cache, s, index, dtype), wide)
        pos_buf = ctx.buffer(position)
        pos = nest.load(position, s, kb.broadcast_index(["b", "s"], pos_buf.shape), pos_buf.dtype)
        return kb.cast(LoadAt(dtype, cache, (kb.cast(pos, "int64"), _i64("k"))), wide)

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


# ---- LinearAttention ------------------------------------------------------------------

RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True)}
RULES["gated_delta"] = (True, True)
"""update_rule -> (gating, delta correction)."""


@lowers("LinearAttention")
def lower_linear_attention(ctx: LowerContext, node: Node) -> None:
    """The recurrence of the spec, one token t after another, over the state
    S[b, n, d, m] of each kv head n (u: the delta rules' retrieved value)::

        S = past (or 0);  Y = 0;  u = 0
        per t:  u[b, t, n, m] += exp(g[t]) * S[b, n, d, m] * k[t, n, d]      delta rules
                S[b, n, d, m]  = exp(g[t]) * S + k[t, n, d] * w[t, n, m]
                Y[b, t, h, m] += scale * q[t, h, d] * S[b, h/R, d, m]
        w = beta[t] * (v[t, n, m] - u[b, t, n, m])  (delta rules), else v[t, n, m]

    exp(g) only for the gated rules. Statements run in order, each over its whole
    domain, so the recurrence is unrolled over the T tokens: 2 or 3 statements a token.
    Internally float32 (float64 for double inputs), as the reference.
    """
    where = f"LinearAttention node {node.name!r}"
    rule = node.attr("update_rule", "gated_delta")
    if rule not in RULES:
        raise LoweringError(f"{where}: update_rule {rule!r} is not one of {sorted(RULES)}")
    gating, delta = RULES[rule]
    for index, name, needed in ((4, "decay", gating), (5, "beta", delta)):
        if bool(node.input(index)) != needed:
            verb = "needs" if needed else "does not take"
            raise LoweringError(f"{where}: update_rule {rule!r} {verb} the {name} input")
    rec = LinearRecurrence(ctx, node, _linear_geometry(ctx, node, where), where)
    for t in range(rec.geo.q_len):
        rec.token(t)
    rec.finish()
    rec.st.emit(ctx, node)


class LinearRecurrence:
    """The statements of one LinearAttention node."""

    def __init__(self, ctx: LowerContext, node: Node, geo: Geometry, where: str):
        self.ctx, self.node, self.geo = ctx, node, geo
        gating, delta = RULES[node.attr("update_rule", "gated_delta")]
        self.st = Statements()
        self.q, self.k, self.v = (ctx.buffer(node.inputs[i]) for i in range(3))
        self.acc = acc = "float64" if self.q.dtype == "float64" else "float32"
        self.decay = _decay(ctx, node, geo, where) if gating else None
        self.beta = _beta(ctx, node, geo, where) if delta else None
        self.scale = float(node.attr("scale", 0.0) or 0.0) or 1 / np.sqrt(geo.head)
        self.s_nest = Nest(("b", "n", "d", "m"), (geo.batch, geo.kv_heads, geo.head, geo.v_head))
        self.s_at = ["b", "n", "d", "m"]
        past = node.input(3)
        if past and ctx.buffer(past).shape != self.s_nest.shape:
            raise LoweringError(
                f"{where}: past_state {ctx.buffer(past).shape} should be {self.s_nest.shape}"
            )
        self.state_dtype = ctx.buffer(past).dtype if past else self.q.dtype
        self.present = node.outputs[1] if len(node.outputs) > 1 else ""
        if self.present:
            ctx.output(self.present, self.s_nest.shape, self.state_dtype)
        own = self.present and self.state_dtype == acc
        self.state = (
            self.present
            if own
            else ctx.temp(f"{node.outputs[0]}.state", self.s_nest.shape, acc).name
        )
        start = (lambda s: self.read(past, self.s_nest, s, self.s_at)) if past else None
        self.st.add(self.s_nest, (self.state, self.s_at), start or (lambda s: kb.const(0, acc)))
        y_shape = (geo.batch, geo.q_len, geo.q_heads * geo.v_head)
        self.y = ctx.output(node.outputs[0], y_shape, self.q.dtype).name
        self.y_acc = self.y if self.q.dtype == acc else ctx.temp(f"{self.y}.acc", y_shape, acc).name
        self.y_nest = Nest(("b", "t", "c"), y_shape)
        self.st.add(self.y_nest, (self.y_acc, ["b", "t", "c"]), lambda s: kb.const(0, acc))
        self.u = ""
        if delta:
            u_nest = Nest(("b", "t", "n", "m"), (geo.batch, geo.q_len, geo.kv_heads, geo.v_head))
            self.u = ctx.temp(f"{self.y}.retrieved", u_nest.shape, acc).name
            self.st.add(u_nest, (self.u, ["b", "t", "n", "m"]), lambda s: kb.const(0, acc))

    def read(self, buf: str, nest: Nest, s: str, index: Sequence[str]) -> Expr:
        return kb.cast(nest.load(buf, s, index, self.ctx.buffer(buf).dtype), self.acc)

    def old_state(self, nest: Nest, s: str, t: int) -> Expr:
        """S[b, n, d, m], times exp(decay) for the gated rules."""
        held = nest.load(self.state, s, self.s_at, self.acc)
        if self.decay is None:
            return held
        buf, per_dim = self.decay
        gate = self.read(buf, nest, s, ["b", str(t), f"{self.geo.head}*n + d" if per_dim else "n"])
        return kb.binary("mul", kb.unary("exp", gate), held)

    def token(self, t: int) -> None:
        geo, acc, st = self.geo, self.acc, self.st
        key_at = ["b", str(t), f"{geo.head}*n + d"]
        if self.u:
            red = Nest(("b", "n", "m", "d"), (geo.batch, geo.kv_heads, geo.v_head, geo.head))
            st.add(
                red,
                (self.u, ["b", str(t), "n", "m"]),
                lambda s: kb.binary(
                    "mul", self.old_state(red, s, t), self.read(self.k.name, red, s, key_at)
                ),
                reduce="add",
            )

        def update(s: str) -> Expr:
            nest = self.s_nest
            value = self.read(self.v.name, nest, s, ["b", str(t), f"{geo.v_head}*n + m"])
            if self.beta is not None:
                got = nest.load(self.u, s, ["b", str(t), "n", "m"], acc)
                buf, per_head = self.beta
                rate = self.read(buf, nest, s, ["b", str(t), "n" if per_head else "0"])
                value = kb.binary("mul", rate, kb.binary("sub", value, got))
            key = self.read(self.k.name, nest, s, key_at)
            return kb.binary("add", self.old_state(nest, s, t), kb.binary("mul", key, value))

        st.add(self.s_nest, (self.state, self.s_at), update)
        out = geo.head_nest.extend(("m", "d"), (geo.v_head, geo.head))
        q_at = ["b", str(t), f"{geo.head}*({geo.q_head}) + d"]

        def read_out(s: str) -> Expr:
            query = kb.binary(
                "mul", kb.const(self.scale, acc), self.read(self.q.name, out, s, q_at)
            )
            held = out.load(self.state, s, ["b", geo.kv_head, "d", "m"], acc)
            return kb.binary("mul", query, held)

        y_at = ["b", str(t), f"{geo.v_head}*({geo.q_head}) + m"]
        st.add(out, (self.y_acc, y_at), read_out, reduce="add")

    def finish(self) -> None:
        """Round Y and present_state to their types when those are narrower."""
        for nest, wide, narrow, index, dtype in (
            (self.y_nest, self.y_acc, self.y, ["b", "t", "c"], self.q.dtype),
            (self.s_nest, self.state, self.present, self.s_at, self.state_dtype),
        ):
            if narrow and narrow != wide:
                self.st.add(
                    nest,
                    (narrow, index),
                    lambda s, n=nest, w=wide, i=index, d=dtype: kb.cast(
                        n.load(w, s, i, self.acc), d
                    ),
                )


def _linear_geometry(ctx: LowerContext, node: Node, where: str) -> Geometry:
    q, k, v = (ctx.buffer(node.inputs[i]) for i in range(3))
    q_heads, kv_heads = (
        int(node.attr("q_num_heads", 0) or 0),
        int(node.attr("kv_num_heads", 0) or 0),
    )
    if q_heads <= 0 or kv_heads <= 0 or q_heads % kv_heads:
        raise LoweringError(
            f"{where}: q_num_heads ({q_heads}) must be a positive multiple of kv_num_heads "
            f"({kv_heads})"
        )
    if len(q.shape) != 3 or len(k.shape) != 3 or len(v.shape) != 3:
        raise LoweringError(f"{where}: query, key and value must be 3-D (B, T, H*D)")
    batch, steps = q.shape[:2]
    if q.shape[2] % q_heads or v.shape[2] % kv_heads:
        raise LoweringError(
            f"{where}: hidden sizes {q.shape[2]}, {v.shape[2]} do not split into heads"
        )
    head, v_head = q.shape[2] // q_heads, v.shape[2] // kv_heads
    if k.shape != (batch, steps, kv_heads * head) or v.shape[:2] != (batch, steps):
        raise LoweringError(
            f"{where}: query {q.shape}, key {k.shape}, value {v.shape} do not match"
        )
    return Geometry(batch, q_heads, kv_heads, steps, steps, 0, head, v_head, True)


def _decay(ctx: LowerContext, node: Node, geo: Geometry, where: str) -> tuple[str, bool]:
    """The decay buffer and whether it is per key dim (else per head)."""
    decay = ctx.buffer(node.input(4))
    per_head, per_dim = (
        (geo.batch, geo.q_len, geo.kv_heads),
        (geo.batch, geo.q_len, geo.kv_heads * geo.head),
    )
    if decay.shape not in (per_head, per_dim):
        raise LoweringError(f"{where}: decay {decay.shape} should be {per_head} or {per_dim}")
    return decay.name, decay.shape == per_dim and decay.shape != per_head


def _beta(ctx: LowerContext, node: Node, geo: Geometry, where: str) -> tuple[str, bool]:
    """The beta buffer and whether it is per head (else one rate for all heads)."""
    beta = ctx.buffer(node.input(5))
    per_head, shared = (geo.batch, geo.q_len, geo.kv_heads), (geo.batch, geo.q_len, 1)
    if beta.shape not in (per_head, shared):
        raise LoweringError(f"{where}: beta {beta.shape} should be {per_head} or {shared}")
    return beta.name, beta.shape == per_head and beta.shape != shared


# ---- CausalConvWithState --------------------------------------------------------------


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


# ---- Swish ------------------------------------------------------------------------------


@lowers("Swish")
def lower_swish(ctx: LowerContext, node: Node) -> None:
    """x * sigmoid(alpha * x); float16 through float32."""
    alpha = float(node.attr("alpha", 1.0))

    def body(xs: list[Expr]) -> Expr:
        x = xs[0]
        if not is_float(x.dtype):
            raise LoweringError(f"Swish node {node.name!r}: input has dtype {x.dtype}")
        wide = kb.cast(x, "float64" if x.dtype == "float64" else "float32")
        scaled = kb.binary("mul", kb.const(alpha, wide.dtype), wide)
        return kb.cast(kb.binary("mul", wide, kb.unary("sigmoid", scaled)), x.dtype)

    elementwise(ctx, node, node.inputs[:1], body)
