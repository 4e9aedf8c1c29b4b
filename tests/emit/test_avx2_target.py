"""The generic path: the same models compiled for an AVX2 target (8-lane vectors, 16
registers: a 6 x 16 GEMM register tile) instead of the host's AVX-512. AVX2 code runs on
this machine, so the results are checked against numpy."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from onnx import helper

from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import supported_ops
from polyonnx.runtime.compiled import compile_graph, default_schedules, lower_model
from polyonnx.target import host_target
from tests.helpers import make_model, random_array, sum_tol, value_info

F32 = np.float32


@pytest.fixture(scope="module")
def avx2():
    host = host_target()
    if host.vector_bits < 256:
        pytest.skip("the host cannot run AVX2 code")
    features = re.sub(r"\+(avx512\w*)", r"-\1", host.features)
    return dataclasses.replace(host, features=features, vector_bits=256)


def _compile(model, target):
    return compile_graph(load_graph(model, supported_ops=supported_ops()), target)


def test_avx2_gemm_tile_is_6_by_16(avx2):
    model = _matmul(37, 600, 70)
    program = lower_model(model)
    (schedule,) = default_schedules(program, avx2)
    assert "ukernel_mr6_nr16" in schedule.tree


def _matmul(m, k, n):
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    return make_model(
        [node],
        [value_info("a", F32, (m, k)), value_info("b", F32, (k, n))],
        [value_info("y", F32, (m, n))],
    )


@pytest.mark.parametrize("shape", [(37, 600, 70), (5, 17, 33), (64, 64, 64)])
def test_avx2_matmul_matches_numpy(avx2, shape):
    m, k, n = shape
    rng = np.random.default_rng(0)
    a, b = random_array(rng, (m, k)), random_array(rng, (k, n))
    got = _compile(_matmul(m, k, n), avx2).run({"a": a, "b": b})["y"]
    np.testing.assert_allclose(got, a @ b, **sum_tol(4 * k))


@pytest.mark.parametrize("tail", range(1, 8))
def test_avx2_columns_past_whole_vectors_match_numpy(avx2, tail):
    """N = 2 x 16 + 8 + tail: the last tile's whole vector, then its tail columns as dot
    products along k (up to DOT_COLUMNS) or as one more masked vector; K = 255 has a tail
    of its own, and 3 rows past whole 6-row tiles."""
    m, k, n = 27, 255, 40 + tail
    rng = np.random.default_rng(tail)
    a, b = random_array(rng, (m, k)), random_array(rng, (k, n))
    got = _compile(_matmul(m, k, n), avx2).run({"a": a, "b": b})["y"]
    np.testing.assert_allclose(got, a @ b, **sum_tol(4 * k))


def test_avx2_strided_padded_conv_with_relu_matches_numpy(avx2):
    rng = np.random.default_rng(1)
    x = random_array(rng, (1, 8, 23, 23))
    w = random_array(rng, (24, 8, 3, 3), low=-0.5, high=0.5)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4, strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    model = make_model(
        nodes, [value_info("x", F32, x.shape)], [value_info("y", F32, (1, 24, 12, 12))], {"w": w}
    )
    got = _compile(model, avx2).run({"x": x})["y"]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 24, 12, 12))
    for i in range(3):
        for j in range(3):
            patch = xp[:, :, i : i + 23 : 2, j : j + 23 : 2]
            want += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j])
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


def test_avx2_conv_read_in_place_matches_numpy(avx2):
    # 3x3 stride 1 "same": the input is read in place under 8-lane window masks; 23 x 23
    # = 66 vectors + 1 column, which runs as a dot product
    rng = np.random.default_rng(2)
    x = random_array(rng, (1, 8, 23, 23))
    w = random_array(rng, (24, 8, 3, 3), low=-0.5, high=0.5)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4)
    model = make_model(
        [node], [value_info("x", F32, x.shape)], [value_info("y", F32, (1, 24, 23, 23))], {"w": w}
    )
    (schedule,) = default_schedules(lower_model(model), avx2)
    assert "packb0" in schedule.tree
    got = _compile(model, avx2).run({"x": x})["y"]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 24, 23, 23))
    for i in range(3):
        for j in range(3):
            want += np.einsum("nchw,mc->nmhw", xp[:, :, i : i + 23, j : j + 23], w[:, :, i, j])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [40, 43])
def test_avx2_gemm_reads_its_weights_packed_once(avx2, n):
    """A constant B packed when compiling (schedule/heuristics/panels.py) in 16-column panels: whole
    panels, the last one partly zero, and a tail of dot-product columns (n = 43)."""
    m, k = 13, 70
    rng = np.random.default_rng(n)
    w = random_array(rng, (k, n))
    node = helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")
    model = make_model(
        [node], [value_info("x", F32, (m, k))], [value_info("y", F32, (m, n))], {"w": w}
    )
    compiled = _compile(model, avx2)
    assert compiled.schedules[0].panels == (("w", "w.panels16"),)
    x = random_array(rng, (m, k))
    np.testing.assert_allclose(compiled.run({"x": x})["y"], x @ w, **sum_tol(4 * k))


@pytest.mark.parametrize("shape", [(8, 8), (20, 37), (64, 24)])
def test_avx2_transposes_in_8_by_8_tiles(avx2, shape):
    """schedule/heuristics/transpose.py's tiles are the vector width: 8 x 8 with AVX2, whole and
    sticking out."""
    node = helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[1, 0])
    model = make_model([node], [value_info("x", F32, shape)], [value_info("y", F32, shape[::-1])])
    (schedule,) = default_schedules(lower_model(model), avx2)
    assert "transpose" in schedule.tree
    x = random_array(np.random.default_rng(1), shape)
    np.testing.assert_array_equal(_compile(model, avx2).run({"x": x})["y"], x.T)
