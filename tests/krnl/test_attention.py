"""Attention, RotaryEmbedding and Swish (polyonnx/krnl/ops/attention.py, rotary.py,
swish.py) against float64 numpy references written from the ONNX specs (opsets 23-25)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import polyonnx
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import lower, supported_ops
from tests.helpers import (
    MATH_TOL,
    assert_matches,
    check_node,
    fast,
    make_model,
    random_array,
    seeds,
    shapes,
    value_info,
)

ATTENTION_INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
ATTENTION_OUTPUTS = ("Y", "present_key", "present_value", "qk_matmul_output")

TOL = {
    "float32": {"rtol": 1e-4, "atol": 2e-5},
    "float16": {"rtol": 2e-3, "atol": 2e-3},
    "float64": {"rtol": 1e-9, "atol": 1e-11},
}
"""float32: sums of up to ~40 products and a polynomial exp; float16: inputs and outputs
rounded to 11 bits (polyonnx computes inside in float32)."""


# ---- the reference -------------------------------------------------------------------


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(batch, seq, heads*size) -> (batch, heads, seq, size); 4-D stays."""
    if x.ndim == 4:
        return x
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def attention_ref(
    q,
    k,
    v,
    mask=None,
    past_key=None,
    past_value=None,
    nonpad=None,
    *,
    q_num_heads=None,
    kv_num_heads=None,
    is_causal=0,
    scale=None,
    softcap=0.0,
    qk_matmul_output_mode=0,
    left_window_size=-1,
    right_window_size=-1,
    softmax_precision=None,
):
    """The Attention spec in float64: returns Y, present_key, present_value and the qk
    output of the given mode (0 raw scaled scores, 1 softcapped, 2 plus masks, 3 softmax)."""
    dtype = q.dtype
    q4, k4, v4 = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
    present_k = k4 if past_key is None else np.concatenate([past_key, k4], 2)
    present_v = v4 if past_value is None else np.concatenate([past_value, v4], 2)
    batch, q_heads, q_len, head = q4.shape
    group = q_heads // present_k.shape[1]
    kk = np.repeat(present_k, group, 1).astype(np.float64)
    vv = np.repeat(present_v, group, 1).astype(np.float64)
    total = kk.shape[2]
    scale = 1 / np.sqrt(head) if scale is None else float(np.float32(scale))  # a FLOAT attr
    root = float(dtype.type(np.sqrt(scale)))
    raw = (q4.astype(np.float64) @ kk.transpose(0, 1, 3, 2)) * root * root
    capped = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    allowed = np.ones((batch, q_heads, q_len, total), bool)
    bias = np.zeros(allowed.shape)
    if mask is not None:
        pad = total - mask.shape[-1]
        full = np.zeros((*mask.shape[:-1], total), mask.dtype)
        full[..., : mask.shape[-1]] = mask
        if mask.dtype == np.bool_:
            allowed &= full
        else:
            bias = bias + full.astype(np.float64)
        allowed[..., total - pad :] = False
    i = np.arange(q_len)[:, None]
    j = np.arange(total)[None, :]
    if nonpad is not None:
        offset = (nonpad - q_len).reshape(-1, 1, 1, 1)
        allowed &= j < nonpad.reshape(-1, 1, 1, 1)
    else:
        offset = 0 if past_key is None else past_key.shape[2]
    if is_causal:
        allowed &= j <= i + offset
    if left_window_size >= 0:
        allowed &= i + offset - j <= left_window_size
    if right_window_size >= 0:
        allowed &= j - i - offset <= right_window_size
    scores = np.where(allowed, capped + bias, -np.inf)
    top = scores.max(-1, keepdims=True)
    top = np.where(np.isneginf(top), 0, top)
    probs = np.exp(scores - top)
    total_sum = probs.sum(-1, keepdims=True)
    probs /= np.where(total_sum == 0, 1, total_sum)
    y = probs @ vv
    if q.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(batch, q_len, -1)
    qk = (raw, capped, scores, probs)[qk_matmul_output_mode]
    return y.astype(dtype), present_k, present_v, qk.astype(dtype)


# ---- running one node ---------------------------------------------------------------


def run_attention(inputs: dict, outputs: tuple[str, ...], opset: int = 24, **attrs):
    """One Attention node with the given named inputs (the rest absent) and outputs."""
    names = [n if n in inputs else "" for n in ATTENTION_INPUTS]
    while names and not names[-1]:
        names.pop()
    outs = [n if n in outputs else "" for n in ATTENTION_OUTPUTS]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node("Attention", names, outs, name="attention_node", **attrs)
    rank = {"Y": inputs["Q"].ndim, "present_key": 4, "present_value": 4, "qk_matmul_output": 4}
    infos = [value_info(n, inputs["Q"].dtype, [None] * rank[n]) for n in outs if n]
    ins = [value_info(n, a.dtype, a.shape) for n, a in inputs.items()]
    model = make_model([node], ins, infos, opset=opset)
    return polyonnx.InferenceSession(model).run(None, inputs), [n for n in outs if n]


def check_attention(inputs: dict, outputs=("Y",), opset=24, tol=None, **attrs):
    got, names = run_attention(inputs, outputs, opset, **attrs)
    args = [inputs.get(n) for n in ATTENTION_INPUTS]
    want = dict(zip(ATTENTION_OUTPUTS, attention_ref(*args, **attrs), strict=True))
    tol = tol or TOL[inputs["Q"].dtype.name]
    for name, actual in zip(names, got, strict=True):
        assert_matches(actual, want[name], tol)


def _attrs(**attrs):
    return {k: v for k, v in attrs.items() if v is not None}


@st.composite
def attention_cases(draw, opset: int = 24, dtype=np.float32):
    """Inputs and attributes of one Attention node: 3-D or 4-D, MHA/GQA/MQA, masks of
    every rank and kind (short ones too), causal, past cache or nonpad lengths, scale,
    softcap and every qk output mode."""
    rng = np.random.default_rng(draw(seeds))
    rank3 = draw(st.booleans())
    batch, kv_heads, group = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 3])), 1
    group = draw(st.sampled_from([1, 1, 2, 3]))
    q_heads = kv_heads * group
    q_len, kv_len = draw(st.sampled_from([1, 2, 5, 7])), draw(st.sampled_from([1, 3, 6, 9]))
    head, v_head = draw(st.sampled_from([1, 4, 8, 17])), draw(st.sampled_from([1, 4, 8, 17]))
    past = draw(st.sampled_from([None, None, 0, 1, 4]))
    nonpad = None
    if past is None and draw(st.booleans()):
        nonpad = np.asarray(rng.integers(0, kv_len + 1, batch), np.int64)
    total = kv_len + (past or 0)

    def tensor(b, h, s, d):
        shape = (b, s, h * d) if rank3 else (b, h, s, d)
        return random_array(rng, shape, dtype, -1, 1)

    inputs = {
        "Q": tensor(batch, q_heads, q_len, head),
        "K": tensor(batch, kv_heads, kv_len, head),
        "V": tensor(batch, kv_heads, kv_len, v_head),
    }
    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    if mask_kind:
        lead = draw(st.sampled_from([(), (q_len,), (1, q_len), (q_heads, 1), (batch, 1, q_len)]))
        if draw(st.booleans()) and lead:
            lead = (*lead[:-1], 1)
        keys = draw(st.sampled_from([total, total, max(total - 2, 1)]))
        if mask_kind == "bool":
            inputs["attn_mask"] = rng.random((*lead, keys)) < 0.7
        else:
            inputs["attn_mask"] = random_array(rng, (*lead, keys), dtype, -2, 2)
    if past is not None:
        inputs["past_key"] = random_array(rng, (batch, kv_heads, past, head), dtype, -1, 1)
        inputs["past_value"] = random_array(rng, (batch, kv_heads, past, v_head), dtype, -1, 1)
    if nonpad is not None:
        inputs["nonpad_kv_seqlen"] = nonpad
    mode = draw(st.sampled_from([None, 0, 1, 2, 3]))
    attrs = _attrs(
        q_num_heads=q_heads if rank3 else None,
        kv_num_heads=kv_heads if rank3 else None,
        is_causal=draw(st.sampled_from([None, 0, 1])),
        scale=draw(st.sampled_from([None, 0.5, 0.1])),
        softcap=draw(st.sampled_from([None, 2.0])),
        qk_matmul_output_mode=mode,
    )
    if opset >= 25:
        attrs.update(
            _attrs(
                left_window_size=draw(st.sampled_from([None, -1, 0, 1, 3])),
                right_window_size=draw(st.sampled_from([None, -1, 0, 2])),
            )
        )
    outputs = ["Y"]
    if past is not None or (draw(st.booleans()) and nonpad is None):
        outputs += ["present_key", "present_value"]
    if mode is not None or draw(st.booleans()):
        outputs.append("qk_matmul_output")
    return inputs, tuple(outputs), attrs


@fast(40)
@given(case=attention_cases())
def test_attention(case):
    inputs, outputs, attrs = case
    check_attention(inputs, outputs, **attrs)


@fast(15)
@given(case=attention_cases(opset=25))
def test_attention_sliding_window(case):
    inputs, outputs, attrs = case
    check_attention(inputs, outputs, opset=25, **attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@fast(6)
@given(data=st.data())
def test_attention_dtypes(dtype, data):
    inputs, outputs, attrs = data.draw(attention_cases(dtype=dtype))
    check_attention(inputs, outputs, **attrs)


@pytest.mark.parametrize("opset", [23, 24])
def test_attention_opsets(opset):
    rng = np.random.default_rng(opset)
    q, k, v = (random_array(rng, (2, 5, 12), np.float32, -1, 1) for _ in range(3))
    check_attention({"Q": q, "K": k, "V": v}, opset=opset, q_num_heads=3, kv_num_heads=3)


def test_attention_softmax_precision():
    """float16 inputs with a float32 softmax; the mode-3 output is in float16."""
    rng = np.random.default_rng(1)
    q, k, v = (random_array(rng, (1, 2, 3, 8), np.float16, -1, 1) for _ in range(3))
    check_attention(
        {"Q": q, "K": k, "V": v},
        ("Y", "qk_matmul_output"),
        qk_matmul_output_mode=3,
        softmax_precision=TensorProto.FLOAT,
    )


def test_attention_fully_masked_rows_are_zero():
    """A query row with no key to attend gives 0 in Y and in the mode-3 output, not NaN:
    an all-False bool row, a row of -inf floats, and rows before a negative offset."""
    rng = np.random.default_rng(2)
    q, k, v = (random_array(rng, (2, 2, 4, 8), np.float32, -1, 1) for _ in range(3))
    bool_mask = np.ones((4, 4), bool)
    bool_mask[1] = False
    float_mask = np.zeros((2, 1, 4, 4), np.float32)
    float_mask[0, 0, 2] = -np.inf
    base = {"Q": q, "K": k, "V": v}
    for extra in ({"attn_mask": bool_mask}, {"attn_mask": float_mask}):
        got, _ = run_attention(
            {**base, **extra}, ("Y", "qk_matmul_output"), qk_matmul_output_mode=3
        )
        assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all()
        check_attention({**base, **extra}, ("Y", "qk_matmul_output"), qk_matmul_output_mode=3)
    nonpad = np.array([1, 4], np.int64)  # batch 0: offset 1 - 4 = -3, rows 0..2 see nothing
    got, _ = run_attention({**base, "nonpad_kv_seqlen": nonpad}, ("Y",), is_causal=1)
    assert (got[0][0, :, :3] == 0).all() and (got[0][0, :, 3] != 0).any()
    check_attention({**base, "nonpad_kv_seqlen": nonpad}, is_causal=1)


def test_attention_causal_with_past_is_bottom_right():
    """With a cache of 3 keys, query i sees keys 0..i+3."""
    rng = np.random.default_rng(3)
    q = random_array(rng, (1, 1, 2, 4), np.float32, -1, 1)
    k, v = (random_array(rng, (1, 1, 2, 4), np.float32, -1, 1) for _ in range(2))
    past = {
        n: random_array(rng, (1, 1, 3, 4), np.float32, -1, 1) for n in ("past_key", "past_value")
    }
    inputs = {"Q": q, "K": k, "V": v, **past}
    got, _ = run_attention(inputs, ("Y", "qk_matmul_output"), is_causal=1, qk_matmul_output_mode=3)
    assert (got[1][0, 0, 0, 4:] == 0).all() and (got[1][0, 0, 0, :4] > 0).all()
    assert (got[1][0, 0, 1] > 0).all()


def test_attention_large_scores_do_not_overflow():
    q = np.full((1, 1, 2, 4), 300.0, np.float32)
    k = np.full((1, 1, 3, 4), 300.0, np.float32)
    v = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    check_attention({"Q": q, "K": k, "V": v}, scale=1.0)


def test_attention_3d_reads_through_access_maps():
    """3-D inputs and GQA lower to a single kernel: no transposed copies of Q/K/V, no
    repeated K/V, and kv heads without floor divisions."""
    rng = np.random.default_rng(4)
    q = random_array(rng, (2, 5, 24), np.float32)
    k, v = (random_array(rng, (2, 7, 8), np.float32) for _ in range(2))
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], q_num_heads=6, kv_num_heads=2)
    model = make_model(
        [node],
        [value_info(n, np.float32, a.shape) for n, a in (("Q", q), ("K", k), ("V", v))],
        [value_info("Y", np.float32, [2, 5, 24])],
        opset=24,
    )
    program = lower(load_graph(model, supported_ops=supported_ops()))
    assert len(program.kernels) == 1
    stmts = program.kernels[0].statements
    writes = {s.write.buffer for s in stmts}
    assert not {"Q", "K", "V"} & writes
    assert all("floor" not in s.domain and "floor" not in s.write.index for s in stmts)
    big = [b for b in writes if program.buffers[b].size >= q.size and b != "Y"]
    assert all(program.buffers[b].shape == (2, 6, 5, 7) for b in big)  # only the scores
    check_attention({"Q": q, "K": k, "V": v}, q_num_heads=6, kv_num_heads=2)


def _expect_error(inputs, match, opset=24, **attrs):
    with pytest.raises(polyonnx.LoweringError, match=match):
        run_attention(inputs, ("Y",), opset, **attrs)


def test_attention_rejects_bad_nodes():
    rng = np.random.default_rng(5)
    q4 = random_array(rng, (1, 4, 3, 8), np.float32)
    k4 = random_array(rng, (1, 3, 3, 8), np.float32)
    _expect_error({"Q": q4, "K": k4, "V": k4}, "not a multiple of 3 key/value heads")
    q3 = random_array(rng, (1, 3, 8), np.float32)
    _expect_error({"Q": q3, "K": q3, "V": q3}, "need q_num_heads and kv_num_heads")
    _expect_error(
        {"Q": q3, "K": q3, "V": q3},
        "hidden size 8 is not a multiple of 3",
        q_num_heads=3,
        kv_num_heads=1,
    )
    k4 = random_array(rng, (1, 4, 3, 8), np.float32)
    base = {"Q": k4, "K": k4, "V": k4}
    _expect_error(base, "only for 3-D inputs", opset=25, q_num_heads=4, kv_num_heads=4)
    _expect_error({**base, "past_key": k4}, "past_key and past_value must be given together")
    nonpad = np.array([2], np.int64)
    past = {"past_key": k4, "past_value": k4, "nonpad_kv_seqlen": nonpad}
    _expect_error({**base, **past}, "nonpad_kv_seqlen cannot be used with past_key")
    _expect_error({**base, "attn_mask": np.ones((2, 3, 3), bool)}, "does not broadcast")
    _expect_error({**base, "attn_mask": np.ones((3, 4), bool)}, "does not broadcast")


# ---- RotaryEmbedding ----------------------------------------------------------------


def rotary_ref(
    x, cos, sin, position_ids=None, *, interleaved=0, rotary_embedding_dim=0, num_heads=0
):
    """The RotaryEmbedding spec in float64."""
    shape = x.shape
    x4 = x.reshape(shape[0], shape[1], num_heads, -1) if x.ndim == 3 else x.transpose(0, 2, 1, 3)
    x4 = x4.astype(np.float64)
    rot = rotary_embedding_dim or x4.shape[-1]
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos[:, :, None].astype(np.float64), sin[:, :, None].astype(np.float64)
    part = x4[..., :rot]
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if interleaved else np.split(part, 2, -1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    out = x4.copy()
    if interleaved:
        out[..., 0:rot:2], out[..., 1:rot:2] = real, imag
    else:
        out[..., :rot] = np.concatenate([real, imag], -1)
    out = out.reshape(shape) if x.ndim == 3 else out.transpose(0, 2, 1, 3)
    return out.astype(x.dtype)


@fast(30)
@given(
    rank3=st.booleans(),
    interleaved=st.booleans(),
    dims=st.tuples(*(st.sampled_from(s) for s in ([1, 2], [1, 3], [1, 5, 7], [2, 8, 18]))),
    partial=st.booleans(),
    with_positions=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float32, np.float16]),
    seed=seeds,
)
def test_rotary_embedding(rank3, interleaved, dims, partial, with_positions, dtype, seed):
    rng = np.random.default_rng(seed)
    batch, heads, seq, size = dims
    rot = size - 2 if partial and size > 2 else size
    x = random_array(rng, (batch, seq, heads * size) if rank3 else (batch, heads, seq, size), dtype)
    attrs = _attrs(
        interleaved=int(interleaved),
        rotary_embedding_dim=rot if partial else None,
        num_heads=heads if rank3 else None,
    )
    if with_positions:
        max_pos = 11
        angles = rng.uniform(0, 6.3, (max_pos, rot // 2))
        positions = rng.integers(0, max_pos, (batch, seq)).astype(np.int64)
    else:
        angles, positions = rng.uniform(0, 6.3, (batch, seq, rot // 2)), None
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    args = [x, cos, sin] + ([positions] if with_positions else [])
    expected = rotary_ref(*args, **{"num_heads": 0, **attrs})
    tol = TOL[np.dtype(dtype).name]
    check_node("RotaryEmbedding", args, expected, tol=tol, opset=23, **attrs)


def test_rotary_embedding_rejects_bad_nodes():
    x = np.ones((1, 2, 8), np.float32)
    cache = np.ones((2, 4), np.float32)
    pos = np.zeros((1, 2), np.int64)
    with pytest.raises(polyonnx.LoweringError, match="num_heads"):
        run_rotary([x, cache[None], cache[None]])
    with pytest.raises(polyonnx.LoweringError, match="rotary_embedding_dim 3"):
        run_rotary([x[None], cache, cache, pos], rotary_embedding_dim=3)
    with pytest.raises(polyonnx.LoweringError, match="cos_cache"):
        run_rotary([x[None], cache[:, :3], cache, pos])


def run_rotary(args, **attrs):
    from tests.helpers import run_node

    return run_node("RotaryEmbedding", args, [args[0]], opset=23, **attrs)


# ---- Swish ------------------------------------------------------------------------------


@fast(15)
@given(
    shape=shapes(max_size=4096),
    alpha=st.sampled_from([None, 1.0, 0.5, -1.7]),
    dtype=st.sampled_from([np.float32, np.float16, np.float64]),
    seed=seeds,
)
def test_swish(shape, alpha, dtype, seed):
    x = random_array(np.random.default_rng(seed), shape, dtype, -10, 10)
    a = 1.0 if alpha is None else float(np.float32(alpha))  # a FLOAT attribute
    wide = x.astype(np.float64)
    expected = (wide / (1 + np.exp(-a * wide))).astype(dtype)
    tol = {"float16": {"rtol": 1e-3, "atol": 1e-3}, "float64": {"rtol": 1e-12, "atol": 1e-14}}
    check_node(
        "Swish",
        [x],
        expected,
        tol=tol.get(np.dtype(dtype).name, MATH_TOL),
        opset=24,
        **_attrs(alpha=alpha),
    )


# ---- LinearAttention ----------------------------------------------------------------


def linear_attention_ref(
    q,
    k,
    v,
    past=None,
    decay=None,
    beta=None,
    *,
    q_num_heads,
    kv_num_heads,
    scale=0.0,
    update_rule="gated_delta",
):
    """The LinearAttention recurrence in float64: Y and present_state."""
    b, t, _ = q.shape
    dk, dv, group = (
        q.shape[2] // q_num_heads,
        v.shape[2] // kv_num_heads,
        q_num_heads // kv_num_heads,
    )
    q4, k4, v4 = (
        _heads(a.astype(np.float64), h)
        for a, h in ((q, q_num_heads), (k, kv_num_heads), (v, kv_num_heads))
    )
    state = np.zeros((b, kv_num_heads, dk, dv)) if past is None else past.astype(np.float64)
    scale = float(np.float32(scale)) or 1 / np.sqrt(dk)
    y = np.zeros((b, q_num_heads, t, dv))
    for i in range(t):
        kt, vt = k4[:, :, i], v4[:, :, i]
        if decay is not None:
            g = decay[:, i].astype(np.float64).reshape(b, kv_num_heads, -1)  # (B, H, 1 or dk)
            state = state * np.exp(g)[..., None]
        if beta is not None:
            rate = np.broadcast_to(beta[:, i].astype(np.float64), (b, kv_num_heads))[..., None]
            vt = rate * (vt - np.einsum("bhdm,bhd->bhm", state, kt))
        state = state + kt[..., :, None] * vt[..., None, :]
        y[:, :, i] = scale * np.einsum("bhd,bhdm->bhm", q4[:, :, i], np.repeat(state, group, 1))
    y = y.transpose(0, 2, 1, 3).reshape(b, t, -1).astype(q.dtype)
    return y, state.astype(q.dtype if past is None else past.dtype)


@fast(25)
@given(
    rule=st.sampled_from(["linear", "gated", "delta", "gated_delta", None]),
    heads=st.sampled_from([(1, 1), (2, 2), (4, 2), (3, 1)]),
    dims=st.tuples(
        st.sampled_from([1, 2]),
        st.sampled_from([1, 2, 5]),
        st.sampled_from([1, 4, 7]),
        st.sampled_from([1, 3, 8]),
    ),
    per_dim_decay=st.booleans(),
    shared_beta=st.booleans(),
    with_past=st.booleans(),
    scale=st.sampled_from([None, 0.0, 0.25]),
    dtype=st.sampled_from([np.float32, np.float32, np.float16]),
    seed=seeds,
)
def test_linear_attention(
    rule, heads, dims, per_dim_decay, shared_beta, with_past, scale, dtype, seed
):
    rng = np.random.default_rng(seed)
    (hq, hkv), (batch, steps, dk, dv) = heads, dims
    q = random_array(rng, (batch, steps, hq * dk), dtype, -1, 1)
    k = random_array(rng, (batch, steps, hkv * dk), dtype, -1, 1)
    v = random_array(rng, (batch, steps, hkv * dv), dtype, -1, 1)
    gating, delta = (
        (rule or "gated_delta") in ("gated", "gated_delta"),
        (rule or "gated_delta") in ("delta", "gated_delta"),
    )
    past = random_array(rng, (batch, hkv, dk, dv), dtype, -1, 1) if with_past else None
    decay = (
        random_array(rng, (batch, steps, hkv * (dk if per_dim_decay else 1)), dtype, -1, 0)
        if gating
        else None
    )
    beta = (
        random_array(rng, (batch, steps, 1 if shared_beta else hkv), dtype, 0, 1) if delta else None
    )
    attrs = _attrs(q_num_heads=hq, kv_num_heads=hkv, scale=scale, update_rule=rule)
    expected = linear_attention_ref(q, k, v, past, decay, beta, **attrs)
    check_node(
        "LinearAttention",
        [q, k, v, past, decay, beta],
        list(expected),
        tol=TOL[np.dtype(dtype).name],
        opset=27,
        **attrs,
    )


def test_linear_attention_rejects_bad_nodes():
    x = np.ones((1, 2, 4), np.float32)
    with pytest.raises(polyonnx.LoweringError, match="needs the decay input"):
        run_node_outputs(
            "LinearAttention", [x, x, x], 2, q_num_heads=2, kv_num_heads=2, update_rule="gated"
        )
    with pytest.raises(polyonnx.LoweringError, match="does not take the beta input"):
        run_node_outputs(
            "LinearAttention",
            [x, x, x, None, None, x[..., :2]],
            2,
            q_num_heads=2,
            kv_num_heads=2,
            update_rule="linear",
        )
    with pytest.raises(polyonnx.LoweringError, match="positive multiple"):
        run_node_outputs(
            "LinearAttention", [x, x, x], 2, q_num_heads=2, kv_num_heads=3, update_rule="linear"
        )


def run_node_outputs(op, args, count, **attrs):
    from tests.helpers import run_node

    return run_node(op, args, [args[0]] * count, opset=27, **attrs)


# ---- CausalConvWithState --------------------------------------------------------------


def causal_conv_ref(x, w, bias=None, past=None, *, activation="none"):
    batch, channels, length = x.shape
    taps = w.shape[2]
    pad = np.zeros((batch, channels, taps - 1), x.dtype) if past is None else past
    seq = np.concatenate([pad, x], 2).astype(np.float64)
    y = sum(
        w[None, :, 0, i, None].astype(np.float64) * seq[:, :, i : i + length] for i in range(taps)
    )
    y = y + (0 if bias is None else bias[None, :, None].astype(np.float64))
    if activation != "none":
        y = y / (1 + np.exp(-y))
    return y.astype(x.dtype), seq[:, :, seq.shape[2] - (taps - 1) :].astype(pad.dtype)


@fast(25)
@given(
    shape=st.tuples(
        st.sampled_from([1, 2]), st.sampled_from([1, 3, 16, 17]), st.sampled_from([1, 2, 5, 9])
    ),
    taps=st.sampled_from([1, 2, 4, 7]),
    with_bias=st.booleans(),
    with_past=st.booleans(),
    activation=st.sampled_from([None, "none", "silu", "swish"]),
    dtype=st.sampled_from([np.float32, np.float32, np.float16, np.float64]),
    seed=seeds,
)
def test_causal_conv_with_state(shape, taps, with_bias, with_past, activation, dtype, seed):
    rng = np.random.default_rng(seed)
    batch, channels, _ = shape
    x = random_array(rng, shape, dtype, -2, 2)
    w = random_array(rng, (channels, 1, taps), dtype, -1, 1)
    bias = random_array(rng, (channels,), dtype, -1, 1) if with_bias else None
    past = random_array(rng, (batch, channels, taps - 1), dtype, -2, 2) if with_past else None
    attrs = _attrs(activation=activation)
    expected = causal_conv_ref(x, w, bias, past, **{"activation": "none", **attrs})
    check_node(
        "CausalConvWithState",
        [x, w, bias, past],
        list(expected),
        tol=TOL[np.dtype(dtype).name],
        opset=27,
        **attrs,
    )


def test_causal_conv_with_state_rejects_bad_nodes():
    x = np.ones((1, 3, 4), np.float32)
    with pytest.raises(polyonnx.LoweringError, match="weight"):
        run_node_outputs("CausalConvWithState", [x, np.ones((2, 1, 3), np.float32)], 2)
    with pytest.raises(polyonnx.LoweringError, match="past_state"):
        run_node_outputs("CausalConvWithState", [x, np.ones((3, 1, 3), np.float32), None, x], 2)
