"""Where native code finds its data: output arrays, constants and the arena start on a
cache line (polyonnx/aligned.py), wherever numpy would have put them."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.aligned import ALIGN, aligned, aligned_empty
from tests.helpers import make_model, random_array, value_info

DTYPES = [np.float32, np.float64, np.int8, np.int32, np.int64, np.uint16, np.bool_]
SHAPES = st.lists(st.integers(0, 9), max_size=4).map(tuple)


@given(shape=SHAPES, dtype=st.sampled_from(DTYPES))
def test_aligned_arrays_start_on_a_line_and_hold_their_values(shape, dtype):
    empty = aligned_empty(shape, dtype)
    assert (empty.shape, empty.dtype) == (shape, np.dtype(dtype))
    assert empty.flags.c_contiguous and empty.flags.writeable
    values = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    if values.ndim:
        values = values[..., ::-1]  # not contiguous
    values.flags.writeable = False
    copy = aligned(values)
    np.testing.assert_array_equal(copy, values)
    assert copy.flags.c_contiguous and not copy.flags.writeable
    assert aligned(copy) is copy
    if empty.size:
        assert empty.ctypes.data % ALIGN == 0 and copy.ctypes.data % ALIGN == 0


def test_strings_are_only_made_contiguous():
    words = np.array([["a", "bc"], ["def", "g"]], dtype=object).T
    copy = aligned(words)
    assert copy.flags.c_contiguous
    np.testing.assert_array_equal(copy, words)


def _matmul_model(m: int, k: int, n: int):
    """y = a[m, k] @ w[k, n] with w an initializer: the output and the weights are
    big enough for numpy to place them 16 bytes past a line."""
    w = random_array(np.random.default_rng(3), (k, n))
    nodes = [helper.make_node("MatMul", ["a", "w"], ["y"])]
    inputs = [value_info("a", np.float32, [m, k])]
    outputs = [value_info("y", np.float32, [m, n])]
    return make_model(nodes, inputs, outputs, {"w": w}), w


def test_outputs_and_constants_start_on_a_cache_line():
    model, w = _matmul_model(64, 300, 512)
    session = polyonnx.InferenceSession(model, threads=1)
    a = random_array(np.random.default_rng(4), (64, 300))
    (y,) = session.run(None, {"a": a})
    np.testing.assert_allclose(y, a @ w, rtol=1e-4, atol=1e-4)  # sums of 300 products
    assert y.ctypes.data % ALIGN == 0
    compiled = session.compiled_for({"a": a})
    constants = compiled.program.constants.values()
    assert constants and all(c.ctypes.data % ALIGN == 0 for c in constants)


def test_a_view_of_a_result_keeps_its_array_from_reuse():
    """The result is a view of a bigger byte array, which a view of the result references
    instead of the result itself: holding such a view must still keep the array."""
    model, w = _matmul_model(4, 8, 16)
    session = polyonnx.InferenceSession(model, threads=1)
    rng = np.random.default_rng(5)
    feeds = [{"a": random_array(rng, (4, 8))} for _ in range(4)]
    views = [session.run(None, feed)[0][1:] for feed in feeds]  # only views are held
    for view, feed in zip(views, feeds, strict=True):
        np.testing.assert_allclose(view, (feed["a"] @ w)[1:], rtol=1e-4, atol=1e-4)
