"""LinearAttention (opset 27): the recurrence of linear attention and its gated and delta
rules, unrolled over the tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.attention import Geometry
from polyonnx.krnl.ops.statements import Nest, Statements

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
