"""Pad (polyonnx/krnl/ops/pad.py) against numpy.pad in every mode, with pads wider than
the input, negative pads (cropping), and pads/values/axes given every way ONNX allows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import ModelError, PolyonnxError
from tests.helpers import check_node, const, fast, random_array, run_node, seeds, shapes

MODES = ("constant", "edge", "reflect", "wrap")


def reference(x, begin, end, mode, value=0):
    """numpy.pad with the positive pads, then the negative ones crop (the same index map)."""
    width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]
    kwargs = {"constant_values": value} if mode == "constant" else {}
    y = np.pad(x, width, mode=mode, **kwargs)
    crop = tuple(
        slice(max(-b, 0), y.shape[r] - max(-e, 0))
        for r, (b, e) in enumerate(zip(begin, end, strict=True))
    )
    return y[crop]


@st.composite
def pads_for(draw, shape, wide: bool, mode: str):
    """(begin, end) per axis; pads up to 2x the dim when ``wide``; crops leave >= 1.
    Reflect pads stay below the dim: wider ones are refused (see the tests below)."""
    begin, end = [], []
    for n in shape:
        top = 2 * n + 1 if wide else 3
        if mode == "reflect":
            top = min(top, n - 1)
        b = draw(st.integers(-(n - 1), top))
        e = draw(st.integers(-(n - 1 - max(-b, 0)), top))
        begin.append(b)
        end.append(e)
    return begin, end


@fast(40)
@given(
    shape=shapes(1, 4, max_size=3000),
    mode=st.sampled_from(MODES),
    data=st.data(),
    seed=seeds,
    dtype=st.sampled_from([np.float32, np.int32, np.uint8]),
)
def test_pad_matches_numpy(shape, mode, data, seed, dtype):
    begin, end = data.draw(pads_for(shape, data.draw(st.booleans()), mode))
    x = random_array(np.random.default_rng(seed), shape, dtype, 0, 100)
    value = np.array(7, dtype)
    args = [x, const(np.array(begin + end, np.int64))]
    if mode == "constant":
        args.append(const(value))
    check_node("Pad", args, reference(x, begin, end, mode, value), mode=mode, opset=13)


@pytest.mark.parametrize("mode", MODES)
def test_pads_and_value_as_attributes_before_opset_11(mode):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    pads = [1, 2, 2, 3]
    want = reference(x, pads[:2], pads[2:], mode, 2.5)
    value = {"value": 2.5} if mode == "constant" else {}
    check_node("Pad", [x], want, mode=mode, pads=pads, opset=10, **value)


def test_constant_value_from_a_graph_input_is_read_at_run_time():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = np.array(-1.5, np.float32)
    want = np.pad(x, [(1, 0), (0, 2)], constant_values=-1.5)
    check_node("Pad", [x, const([1, 0, 0, 2]), value], want, opset=13)


def test_absent_constant_value_pads_with_zeros():
    x = np.ones((2, 2), np.int64)
    check_node("Pad", [x, const([1, 1, 1, 1])], np.pad(x, 1), opset=13)
    check_node("Pad", [x, const([1, 1, 1, 1]), None], np.pad(x, 1), opset=13)


@pytest.mark.parametrize("mode", MODES)
def test_axes_input_of_opset_18_with_negative_axes(mode):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    want = reference(x, [0, 2, 1], [0, 1, 3], mode)
    args = [x, const([1, 2, 3, 1]), None, const(np.array([-1, 1], np.int64))]
    check_node("Pad", args, want, mode=mode, opset=18)


def test_pads_given_as_a_graph_input_are_specialised_on():
    x = np.arange(5, dtype=np.float32)
    pads = np.array([2, 3], np.int64)
    check_node("Pad", [x, pads], np.pad(x, (2, 3), mode="reflect"), mode="reflect", opset=13)


def test_reflect_of_a_single_element_is_refused():
    x = np.array([[4.0], [5.0]], np.float32)
    with pytest.raises(
        ModelError, match=r"Pad node .*reflect pads \[0, 3, 0, 2\] .*size 1 of axis 1"
    ):
        run_node("Pad", [x, const([0, 3, 0, 2])], [np.zeros((2, 6), np.float32)], mode="reflect")


@pytest.mark.parametrize("side", ["begin", "end"])
def test_reflect_pads_must_stay_below_the_dim(side):
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    fits, wide = ([0, 4, 0, 0], [0, 5, 0, 0]) if side == "begin" else ([0, 0, 0, 4], [0, 0, 0, 5])
    want = reference(x, fits[:2], fits[2:], "reflect")
    check_node("Pad", [x, const(fits)], want, mode="reflect", opset=13)
    with pytest.raises(ModelError, match=r"reflect pads .* are not below the size 5 of axis 1"):
        run_node("Pad", [x, const(wide)], [np.zeros((2, 10), np.float32)], mode="reflect", opset=13)


def test_cropping_everything_gives_an_empty_tensor():
    x = np.ones((3, 4), np.float32)
    check_node("Pad", [x, const([0, -2, 0, -2])], x[:, 2:2], opset=13)


def test_cropping_past_the_input_is_refused():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(PolyonnxError):
        run_node("Pad", [x, const([0, -3, 0, -3])], [x], opset=13)


def test_unknown_mode_is_refused():
    x = np.ones((3,), np.float32)
    with pytest.raises(PolyonnxError, match="mode"):
        run_node("Pad", [x, const([1, 1])], [np.ones(5, np.float32)], mode="mirror", opset=13)
