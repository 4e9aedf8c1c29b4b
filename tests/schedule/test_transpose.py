"""Transposes that turn rows (schedule/heuristics/transpose.py, emit/transpose.py): tiles transposed
in registers, whole and (under masks) sticking out of the data, against numpy on hypothesis
shapes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.runtime.compiled import default_schedules, lower_model
from polyonnx.target import host_target
from tests.helpers import fast, make_model, random_array, seeds, value_info

sides = st.sampled_from((1, 3, 15, 16, 17, 31, 32, 40, 64))


def _model(shape, perm, dtype=np.float32):
    out = [shape[p] for p in perm]
    node = helper.make_node("Transpose", ["x"], ["y"], name="t", perm=list(perm))
    return make_model([node], [value_info("x", dtype, shape)], [value_info("y", dtype, out)])


def _marked(model) -> bool:
    """Whether the default schedule for this host tiles the transpose."""
    (schedule,) = default_schedules(lower_model(model))
    return "transpose" in schedule.tree


@fast(30)
@given(
    rows=sides,
    cols=sides,
    outer=st.sampled_from((1, 2, 3)),
    perm=st.sampled_from(((1, 0, 2), (0, 2, 1), (2, 0, 1), (2, 1, 0))),
    threads=st.sampled_from((1, 2)),
    seed=seeds,
)
def test_a_transpose_that_turns_rows_matches_numpy(rows, cols, outer, perm, threads, seed):
    shape = (outer, rows, cols)
    x = random_array(np.random.default_rng(seed), shape)
    model = _model(shape, perm)
    got = polyonnx.InferenceSession(model, threads=threads).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    lanes = host_target().lanes(4)
    # the output's rows run along another input axis than the input's rows (axes of one
    # element aside), and both are a vector long
    rows_out = [p for p in perm if shape[p] > 1][-1:]
    rows_in = [a for a in range(3) if shape[a] > 1][-1:]
    turns = rows_out != rows_in and min([shape[a] for a in rows_out + rows_in]) >= lanes
    assert _marked(model) == turns


def test_attention_keys_transposed_in_registers():
    """1 x 128 x 12 x 64 -> 1 x 12 x 64 x 128 (K^T): whole 16 x 16 tiles."""
    shape, perm = (1, 128, 12, 64), (0, 2, 3, 1)
    x = random_array(np.random.default_rng(0), shape)
    model = _model(shape, perm)
    assert _marked(model)
    got = polyonnx.InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.transpose(x, perm))


def test_other_dtypes_keep_the_plain_loop():
    shape, perm = (40, 33), (1, 0)
    x = np.arange(40 * 33, dtype=np.int64).reshape(shape)
    model = _model(shape, perm, np.int64)
    assert not _marked(model)
    got = polyonnx.InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x.T)
