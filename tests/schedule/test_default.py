"""Default loop nests: contiguous loops coalesced into one SIMD loop, row-wise kernels
fused per row, a contraction's init computed in its register tile. Each structure is
checked, and the results against numpy on hypothesis shapes (odd sizes, broadcasting)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.runtime.compiled import lower_model
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.pseudo_c import pseudo_c
from polyonnx.target import host_target
from tests.helpers import (
    FLOAT_TOL,
    MATH_TOL,
    fast,
    make_model,
    random_array,
    seeds,
    square_conv_model,
    value_info,
)

F32 = np.float32
small = st.sampled_from((1, 2, 3, 5, 7, 13, 16, 17))


AVX512_TILES = pytest.mark.skipif(
    host_target().lanes(4) != 16,
    reason="asserts the nest of 16-lane (AVX-512) vectors: 64-column tiles; this host has "
    "other vectors",
)


def _nest(model, kernel: int = 0) -> str:
    program = lower_model(model)
    return pseudo_c(
        default_schedule(program.kernels[kernel], program.buffers), dict(program.buffers)
    )


def _unary(op: str, shape, out_shape=None, **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="n", **attrs)
    return make_model(
        [node], [value_info("x", F32, shape)], [value_info("y", F32, out_shape or shape)]
    )


def test_contiguous_loops_become_one_simd_loop():
    text = _nest(_unary("Relu", (1, 64, 7, 7)))
    assert "#pragma vectorize\nfor (int d1_d2_d3 = 0; d1_d2_d3 <= 3135; d1_d2_d3++)" in text


def test_broadcast_stops_the_coalescing_where_the_strides_break():
    # b is [7, 1]: it moves along d1 but not along d2, so d2 (the SIMD loop) stays alone
    node = helper.make_node("Add", ["x", "b"], ["y"], name="add")
    model = make_model(
        [node],
        [value_info("x", F32, (4, 7, 9)), value_info("b", F32, (7, 1))],
        [value_info("y", F32, (4, 7, 9))],
    )
    text = _nest(model)
    assert "#pragma vectorize\n    for (int d2 = 0; d2 <= 8; d2++)" in text


@fast(20)
@given(
    a=small,
    b=small,
    c=small,
    broadcast=st.sampled_from(("none", "row", "col", "scalar")),
    seed=seeds,
)
def test_coalesced_elementwise_matches_numpy(a, b, c, broadcast, seed):
    rng = np.random.default_rng(seed)
    other = {"none": (a, b, c), "row": (b, 1), "col": (c,), "scalar": ()}[broadcast]
    x, y = random_array(rng, (a, b, c)), random_array(rng, other)
    nodes = [
        helper.make_node("Mul", ["x", "y"], ["t"], name="mul"),
        helper.make_node("Sigmoid", ["t"], ["z"], name="sig"),
    ]
    model = make_model(
        nodes,
        [value_info("x", F32, x.shape), value_info("y", F32, y.shape)],
        [value_info("z", F32, (a, b, c))],
    )
    got = polyonnx.InferenceSession(model).run(None, {"x": x, "y": y})[0]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-(x * y))), **MATH_TOL)


def test_softmax_runs_row_by_row():
    text = _nest(_unary("Softmax", (8, 300), axis=-1))
    lines = text.splitlines()
    assert lines[0] == "for (int d0 = 0; d0 <= 7; d0++)"
    assert all(line.startswith("  ") for line in lines[1:] if line)  # all inside the row loop


@fast(15)
@given(rows=small, cols=st.sampled_from((1, 3, 16, 17, 100, 130, 257)), seed=seeds)
def test_row_fused_softmax_and_layernorm_match_numpy(rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = random_array(rng, (rows, cols))
    got = polyonnx.InferenceSession(_unary("Softmax", x.shape, axis=-1)).run(None, {"x": x})[0]
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), **MATH_TOL)
    scale, bias = random_array(rng, (cols,)), random_array(rng, (cols,))
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="ln", axis=-1)
    model = make_model(
        [node], [value_info("x", F32, x.shape)], [value_info("y", F32, x.shape)],
        {"s": scale, "b": bias},
    )  # fmt: skip
    got = polyonnx.InferenceSession(model).run(None, {"x": x})[0]
    mean = x.mean(axis=-1, keepdims=True)
    want = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want * scale + bias, rtol=1e-4, atol=1e-4)


def test_gemm_init_is_computed_in_the_register_tile():
    rng = np.random.default_rng(0)
    w, c = random_array(rng, (40, 50)), random_array(rng, (50,))
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="gemm", beta=0.5)
    model = make_model(
        [node], [value_info("x", F32, (30, 40))], [value_info("y", F32, (30, 50))],
        {"w": w, "c": c},
    )  # fmt: skip
    text = _nest(model)
    assert text.startswith("#pragma ukernel_")  # no loop of its own before the mark
    x = random_array(rng, (30, 40))
    got = polyonnx.InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ w + 0.5 * c, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got, x @ w + 0.5 * c, **{**FLOAT_TOL, "atol": 1e-4})


def test_a_batch_one_softmax_is_fused_per_row_block():
    text = _nest(_unary("Softmax", (1, 12, 40, 130), axis=-1))
    lines = text.removeprefix("#pragma parallel\n").splitlines()  # (its blocks on threads)
    assert lines[0] == "for (int d1 = 0; d1 <= 11; d1++)"
    assert all(line.startswith("  ") for line in lines[1:] if line)


@fast(20)
@given(
    rows=st.sampled_from((None, 1, 2, 3)),
    depth=st.sampled_from((16, 17, 31, 64, 100)),
    cols=st.sampled_from((16, 17, 33, 100)),
    batch=st.sampled_from((1, 3)),
    threads=st.sampled_from((1, 2)),
    seed=seeds,
)
def test_a_matrix_vector_product_reads_blocks_of_whole_rows(
    rows, depth, cols, batch, threads, seed
):
    """Fewer than 4 rows (None: a 1-D vector times a matrix): the reduction is cut into
    blocks of rows read side by side, outside the column loop; results match numpy."""
    rng = np.random.default_rng(seed)
    a_shape = (depth,) if rows is None else (batch, rows, depth)
    out = (cols,) if rows is None else (batch, rows, cols)
    w = random_array(rng, (depth, cols))
    node = helper.make_node("MatMul", ["a", "w"], ["y"], name="mm")
    model = make_model(
        [node], [value_info("a", F32, a_shape)], [value_info("y", F32, out)], {"w": w}
    )
    text = _nest(model)
    blocks = text.index("for (int k_o = 0;")  # the row blocks, around the column loop
    assert "+=" not in text[:blocks] and "+=" in text[blocks:]
    a = random_array(rng, a_shape)
    got = polyonnx.InferenceSession(model, threads=threads, tuning_db=False).run(None, {"a": a})[0]
    want = np.matmul(a.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * depth)


@AVX512_TILES
def test_a_big_matrix_vector_product_reads_slices_of_k_side_by_side(monkeypatch):
    """A one-row MatMul split in two parts of K (the size threshold patched to 0): each
    part reads 8 slices of its K side by side, row k of each, 4 rows apart here."""
    from polyonnx.krnl.ops import matmul

    monkeypatch.setattr(matmul, "SPLIT_K_BYTES", 0)
    rng = np.random.default_rng(0)
    w = random_array(rng, (64, 40))
    node = helper.make_node("MatMul", ["a", "w"], ["y"], name="mm")
    model = make_model(
        [node], [value_info("a", F32, (1, 64))], [value_info("y", F32, (1, 40))], {"w": w}
    )
    text = _nest(model)
    loops = [line.strip() for line in text.splitlines() if line.strip().startswith("for")]
    assert loops[2:4] == ["for (int h = 0; h <= 1; h++)", "for (int k = 0; k <= 3; k++)"]
    reads = [f"w[((32 * h) + k) + {4 * t}]" for t in range(1, 8)]
    assert all(read in text for read in reads)


@AVX512_TILES
def test_a_matrix_vector_product_reading_b_shifted_runs_its_whole_tiles_apart(monkeypatch):
    """B an input, its columns read shifted by numpy's start (INPUT_OFFSET, 4 floats):
    columns 4..303 stand for 0..299, tiles of 64; the whole tiles 1..3 are generated
    apart, with constant bounds (each slice's row one vector loop of the same body)."""
    from polyonnx.krnl.ops import matmul

    monkeypatch.setattr(matmul, "SPLIT_K_BYTES", 0)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    feeds = [value_info("a", F32, (1, 64)), value_info("b", F32, (64, 300))]
    text = _nest(make_model([node], feeds, [value_info("y", F32, (1, 300))]))
    assert "for (int j_o = 1; j_o <= 3; j_o++)" in text
    assert "b[(32 * h) + k][((64 * j_o) + j_i) - 4]" in text


def test_one_row_of_dot_products_keeps_the_reduction_in_simd():
    """A classifier's Gemm with transB (weights [N, K]): each output is a dot product of
    two contiguous rows, so the reduction stays the SIMD loop (row blocks would read the
    weights a lane at a time: light AlexNet ran 7x slower)."""
    rng = np.random.default_rng(0)
    w = random_array(rng, (37, 300))
    node = helper.make_node("Gemm", ["a", "w"], ["y"], name="fc", transB=1)
    model = make_model(
        [node], [value_info("a", F32, (1, 300))], [value_info("y", F32, (1, 37))], {"w": w}
    )
    assert "k_o" not in _nest(model)
    a = random_array(rng, (1, 300))
    got = polyonnx.InferenceSession(model, tuning_db=False).run(None, {"a": a})[0]
    np.testing.assert_allclose(
        got, a.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-3
    )


@fast(20)
@given(
    m=st.sampled_from((1, 2, 3, 4, 7, 17)), k=st.sampled_from((1, 5, 64, 300)),
    n=st.sampled_from((1, 10, 37, 64)), trans_a=st.booleans(), bias=st.booleans(), seed=seeds,
)  # fmt: skip
def test_a_gemm_with_constant_weights_for_transb_matches_numpy(m, k, n, trans_a, bias, seed):
    """From 3 rows the lowering transposes constant [N, K] weights once (krnl/ops/matmul.py
    TRANSPOSED_ROWS); fewer rows read them as they are, as dot products."""
    rng = np.random.default_rng(seed)
    w, b = random_array(rng, (n, k)), random_array(rng, (n,))
    inputs = ["a", "w", "b"] if bias else ["a", "w"]
    node = helper.make_node("Gemm", inputs, ["y"], name="fc", transA=int(trans_a), transB=1)
    consts = {"w": w, "b": b} if bias else {"w": w}
    a_shape = (k, m) if trans_a else (m, k)
    model = make_model(
        [node], [value_info("a", F32, a_shape)], [value_info("y", F32, (m, n))], consts
    )
    a = random_array(rng, a_shape)
    got = polyonnx.InferenceSession(model, tuning_db=False).run(None, {"a": a})[0]
    a64 = a.astype(np.float64).T if trans_a else a.astype(np.float64)
    want = a64 @ w.T.astype(np.float64) + (b if bias else 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * k)


def test_rows_of_dot_products_keep_the_reduction_in_simd():
    """Two rows of a Gemm with transB and weights that are an input (not transposed at
    load): no row blocks, whose vectors would take lanes K floats apart (11 ms against
    0.4 for 2 x 2048 x 1000)."""
    node = helper.make_node("Gemm", ["a", "w"], ["y"], name="fc", transB=1)
    model = make_model(
        [node],
        [value_info("a", F32, (2, 300)), value_info("w", F32, (37, 300))],
        [value_info("y", F32, (2, 37))],
    )
    assert "k_o" not in _nest(model)


def test_a_classifier_conv_over_a_1x1_image_sums_its_channels_in_simd():
    # the output pixel's dims (extent 1) score best for SIMD but cannot fill a vector: the
    # channel reduction, contiguous in the weights and the input, takes the SIMD lanes
    model = square_conv_model(1024, 1000, 1, 1, pad=0)
    program = lower_model(model)
    (kernel,) = program.kernels
    tree = default_schedule(kernel, program.buffers).tree
    assert "vectorize" in tree
    x = np.random.default_rng(0).standard_normal((1, 1024, 1, 1)).astype(np.float32)
    got = polyonnx.InferenceSession(model, threads=1).run(None, {"x": x})[0]
    np.testing.assert_allclose(got.reshape(-1), np.full(1000, x.sum()), rtol=1e-4)
