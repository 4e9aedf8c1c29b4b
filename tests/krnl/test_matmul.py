"""Contraction lowerings (polyonnx/krnl/ops/matmul.py): MatMul with numpy semantics and Gemm,
against float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx
from polyonnx.aligned import ALIGN, aligned_empty
from tests.helpers import (
    DIMS,
    Const,
    assert_matches,
    broadcast_shapes,
    check_node,
    const,
    fast,
    node_model,
    random_array,
    run_node,
    seeds,
    sum_tol,
)

mnk = st.sampled_from((*DIMS, 64))


@st.composite
def matmul_shapes(draw):
    """Operand shapes of every MatMul form: 1-D × 1-D, 1-D × N-D, N-D × 1-D, 2-D, and
    batched with numpy-broadcast batch dims of different ranks."""
    m, k, n = draw(mnk), draw(st.one_of(st.just(1), mnk)), draw(mnk)
    batch_a, batch_b = draw(broadcast_shapes(2, max_rank=2))
    a = (k,) if draw(st.booleans()) else (*batch_a, m, k)
    b = (k,) if draw(st.booleans()) else (*batch_b, k, n)
    return a, b


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.matmul(a, b)
    return np.asarray(np.matmul(a.astype(np.float64), b.astype(np.float64))).astype(a.dtype)


@fast(25)
@given(ab=matmul_shapes(), seed=seeds)
def test_matmul(ab, seed):
    rng = np.random.default_rng(seed)
    a = random_array(rng, ab[0], np.float32, -1, 1)
    b = random_array(rng, ab[1], np.float32, -1, 1)
    check_node("MatMul", [a, b], _matmul(a, b), tol=sum_tol(ab[0][-1]))


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((17,), (17,)),  # 1-D × 1-D: a scalar
        ((1,), (1,)),
        ((33,), (2, 33, 5)),  # 1-D × N-D: the vector is prepended a 1, then dropped
        ((3, 7, 31), (31,)),  # N-D × 1-D
        ((13, 1), (1, 17)),  # K = 1: an outer product
        ((31, 33), (33, 17)),
        ((16, 32), (32, 48)),  # exact multiples of the vector width
        ((2, 1, 5, 3), (7, 3, 2)),  # batch dims broadcast both ways
        ((1, 3, 4), (3, 4, 5)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_matmul_forms(sa, sb, dtype):
    rng = np.random.default_rng(0)
    a = random_array(rng, sa, dtype, -3, 3)
    b = random_array(rng, sb, dtype, -3, 3)
    check_node("MatMul", [a, b], _matmul(a, b), tol=sum_tol(9 * sa[-1]))


@fast(15)
@given(ab=matmul_shapes(), seed=seeds)
def test_matmul_constant_weights(ab, seed):
    """B as an initializer (how models carry weights) reads the same as B as an input."""
    rng = np.random.default_rng(seed)
    a = random_array(rng, ab[0], np.float32, -1, 1)
    b = random_array(rng, ab[1], np.float32, -1, 1)
    check_node("MatMul", [a, const(b)], _matmul(a, b), tol=sum_tol(ab[0][-1]))


def _session(op_type, args, rank, **attrs):
    model, _ = node_model(op_type, args, [(np.float32, rank)], **attrs)
    return polyonnx.InferenceSession(model)


def test_matmul_inner_dims_must_agree():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    with pytest.raises(polyonnx.LoweringError, match=r"'matmul_node'.*\(2, 3\) @ \(4, 5\)"):
        _session("MatMul", [a, b], 2)


def test_gemm_needs_matrices():
    a, b = np.ones((2, 3, 1), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(polyonnx.LoweringError, match=r"'gemm_node'.*2-D.*\(2, 3, 1\)"):
        _session("Gemm", [a, b], 2)


# ---- Gemm ---------------------------------------------------------------------------

C_FORMS = ["absent", "scalar", "one", "row", "row2d", "column", "full", "literal", "weights"]


def _c_operand(form: str, rng: np.random.Generator, m: int, n: int):
    """C in one of its broadcast forms: absent, [], [1], [N], [1, N], [M, 1], [M, N]; a
    one-element initializer (which becomes a literal), or an [N] initializer (a bias)."""
    shape = {"scalar": (), "one": (1,), "row": (n,), "row2d": (1, n), "column": (m, 1)}
    if form == "absent":
        return None
    if form == "literal":
        return const(np.array([0.75], np.float32))
    if form == "weights":
        return const(random_array(rng, (n,), np.float32, -1, 1))
    return random_array(rng, shape.get(form, (m, n)), np.float32, -1, 1)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@fast(15)
@given(
    m=mnk,
    k=st.one_of(st.just(1), mnk),
    n=mnk,
    c_form=st.sampled_from(C_FORMS),
    alpha=st.one_of(st.none(), st.sampled_from([1.0, -0.5, 2.0])),
    beta=st.one_of(st.none(), st.sampled_from([1.0, 0.0, 0.25, -3.0])),
    seed=seeds,
)
def test_gemm(trans_a, trans_b, m, k, n, c_form, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    a = random_array(rng, (k, m) if trans_a else (m, k), np.float32, -1, 1)
    b = random_array(rng, (n, k) if trans_b else (k, n), np.float32, -1, 1)
    c = _c_operand(c_form, rng, m, n)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected = (1.0 if alpha is None else alpha) * (
        (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    )
    if c is not None:
        c_value = c.value if isinstance(c, Const) else c
        expected = expected + (1.0 if beta is None else beta) * c_value.astype(np.float64)
    attrs = {"transA": trans_a, "transB": trans_b}
    attrs |= {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
    args = [a, b] if c is None else [a, b, c]
    check_node("Gemm", args, expected.astype(np.float32), tol=sum_tol(4 * k), opset=13, **attrs)


def test_float16_matmul_accumulates_in_float32():
    """An fp16 accumulator loses ~log2(K) bits; numpy sums fp16 products in float32."""
    rng = np.random.default_rng(11)
    a = rng.uniform(0, 1, (4, 1024)).astype(np.float16)
    b = rng.uniform(0, 1, (1024, 3)).astype(np.float16)
    (got,) = run_node("MatMul", [a, b], [a @ b])
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got, want)


@fast(25)
@given(
    k=st.sampled_from((2, 4, 12, 16, 24, 34, 48, 130)),
    n=st.sampled_from((1, 5, 16, 33, 100)),
    one_d=st.booleans(),
    weights=st.booleans(),
    threads=st.sampled_from((1, 2)),
    seed=seeds,
)
def test_a_matrix_vector_product_summed_in_slices_of_k(k, n, one_d, weights, threads, seed):
    """A one-row MatMul split in SPLIT_K parts of K (every size here: the threshold
    patched to 0), each part's sum a row of a temp, then the rows added. Each part reads
    8, 4, 2 or 1 slices side by side, the most that divides it (k 16 and 48, 24, 4 and 12,
    2)."""
    from polyonnx.krnl.ops import matmul

    rng = np.random.default_rng(seed)
    a = random_array(rng, (k,) if one_d else (1, k), np.float32, -1, 1)
    b = random_array(rng, (k, n), np.float32, -1, 1)
    model, feed = node_model("MatMul", [a, Const(b) if weights else b], [(np.float32, a.ndim)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matmul, "SPLIT_K_BYTES", 0)
        prog = polyonnx.load(model)
    assert any(name.endswith(".sum") for name in prog.kernels)
    got = polyonnx.InferenceSession(prog, threads=threads).run(None, feed)[0]
    assert_matches(got, _matmul(a, b), sum_tol(k))


@pytest.mark.parametrize(
    ("sa", "sb", "split"),
    [
        ((1, 4096), (4096, 4096), True),  # B 64 MB
        ((4096,), (4096, 1024), True),  # 16 MB
        ((1, 1024), (1024, 512), False),  # 2 MB: in cache
        ((1, 4095), (4095, 4096), False),  # K odd
        ((2, 4096), (4096, 4096), False),  # two rows
        ((3, 1, 4096), (4096, 4096), False),  # batched
    ],
)
def test_which_matrix_vector_products_are_split(sa, sb, split):
    model, _ = node_model(
        "MatMul", [np.zeros(sa, np.float32), np.zeros(sb, np.float32)],
        [(np.float32, max(len(sa), 2) if len(sa) > 1 else 1)],
    )  # fmt: skip
    names = polyonnx.load(model).kernels
    assert any(name.endswith(".sum") for name in names) == split


def _at_offset(array: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``array`` whose data starts ``offset`` bytes past a cache line."""
    raw = aligned_empty((array.nbytes + ALIGN,), np.uint8)
    copy = raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


@fast(20)
@given(
    k=st.sampled_from((16, 48, 130)),
    n=st.sampled_from((5, 33, 100, 300)),
    offset=st.sampled_from((0, 2, 4, 16, 36, 60)),
    threads=st.sampled_from((1, 2)),
    seed=seeds,
)
def test_a_matrix_vector_product_reads_b_from_any_start(k, n, offset, threads, seed):
    """B, an input, read from ``offset`` bytes past a cache line (2: not even on a float)
    by code laid out for numpy's start (16), then, compiled once more, for its own."""
    from polyonnx.krnl.ops import matmul

    rng = np.random.default_rng(seed)
    a = random_array(rng, (1, k), np.float32, -1, 1)
    b = random_array(rng, (k, n), np.float32, -1, 1)
    model, _ = node_model("MatMul", [a, b], [(np.float32, 2)])
    names = [v.name for v in model.graph.input]
    feed = {names[0]: a, names[1]: _at_offset(b, offset)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matmul, "SPLIT_K_BYTES", 0)
        session = polyonnx.InferenceSession(model, threads=threads)
        got = session.run(None, feed)[0]
        assert session.compiled_for(feed).program.input_offsets == {names[1]: offset}
    assert_matches(got, _matmul(a, b), sum_tol(k))


def test_code_is_compiled_once_per_start_of_b_met(monkeypatch):
    from polyonnx.krnl.ops import matmul

    monkeypatch.setattr(matmul, "SPLIT_K_BYTES", 0)
    rng = np.random.default_rng(0)
    a, b = random_array(rng, (1, 64)), random_array(rng, (64, 300))
    model, _ = node_model("MatMul", [a, b], [(np.float32, 2)])
    names = [v.name for v in model.graph.input]
    session = polyonnx.InferenceSession(model)
    at = {offset: {names[0]: a, names[1]: _at_offset(b, offset)} for offset in (16, 0)}
    numpy_start = session.compiled_for(at[16])  # compiled when the session was made
    assert numpy_start.program.input_offsets == {names[1]: matmul.INPUT_OFFSET}
    aligned = session.compiled_for(at[0])
    assert aligned is not numpy_start and aligned.program.input_offsets == {names[1]: 0}
    again = {names[0]: a, names[1]: _at_offset(b, 16)}
    assert session.compiled_for(again) is numpy_start
    for feed in (*at.values(), again):
        np.testing.assert_allclose(session.run(None, feed)[0], a @ b, rtol=1e-5, atol=1e-4)
