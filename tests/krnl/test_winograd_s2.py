"""3x3 stride-2 Convs by Winograd over the stride's phases (polyonnx/krnl/ops/winograd_s2.py):
which Convs take it, its tables, its kernels and their default schedules, and the result
against a float64 numpy convolution on hypothesis shapes: odd and prime sizes (tiles
sticking out of the output), pads 0 or 1 at either end, a batch, bias or none, a Relu
after it, with the GEMM's micro-kernel under other parameters and threads."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.krnl.ir import Buffer
from polyonnx.krnl.ops import winograd_s2
from polyonnx.krnl.ops.conv import Axis
from polyonnx.runtime.compiled import lower_model
from polyonnx.schedule.default import default_schedule
from tests.helpers import fast, make_model, random_array, seeds, square_conv_model, value_info
from tests.krnl.test_conv import conv_ref, out_size
from tests.krnl.test_winograd import PARAMS

F32 = np.float32


def _model(x_shape, w, bias, pads, out_shape):
    inputs = ["x", "w", "b"] if bias is not None else ["x", "w"]
    nodes = [
        helper.make_node("Conv", inputs, ["c"], name="conv", pads=pads, strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    constants = {"w": w} if bias is None else {"w": w, "b": bias}
    feeds = [value_info("x", F32, x_shape)]
    return make_model(nodes, feeds, [value_info("y", F32, out_shape)], constants)


@contextlib.contextmanager
def _every_3x3_stride_2_conv():
    """This lowering for every 3x3 stride-2 Conv, however few its channels and tiles."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(winograd_s2, "CHANNEL_PAIRS", 1)
        patch.setattr(winograd_s2, "MIN_TILES", 1)
        patch.setattr(winograd_s2, "TILE_WORK", 100.0)
        yield


@fast(25)
@given(
    size=st.tuples(st.sampled_from((1, 2, 3, 8, 9, 13, 17)), st.sampled_from((1, 4, 7, 11, 16))),
    pads=st.tuples(*[st.integers(0, 1)] * 4),
    c=st.sampled_from((1, 3, 16)),
    m=st.sampled_from((1, 5, 17)),
    batch=st.sampled_from((1, 2)),
    bias=st.booleans(),
    params=st.sampled_from(PARAMS),
    threads=st.sampled_from((1, 2)),
    seed=seeds,
)
def test_a_stride_2_winograd_conv_matches_numpy(
    size, pads, c, m, batch, bias, params, threads, seed
):
    begin, end = pads[:2], pads[2:]
    outs = [out_size(n, 3, 2, 1, b, e) for n, b, e in zip(size, begin, end, strict=True)]
    if min(outs) < 1:
        return  # the window does not fit: a load-time error (tests/krnl/test_conv.py)
    rng = np.random.default_rng(seed)
    x = random_array(rng, (batch, c, *size))
    w = random_array(rng, (m, c, 3, 3))
    b = random_array(rng, (m,)) if bias else None
    ref = np.maximum(conv_ref(x, w, b, 1, (2, 2), (1, 1), begin, outs), 0)
    with _every_3x3_stride_2_conv():
        prog = polyonnx.load(_model(x.shape, w, b, list(pads), ref.shape))
    assert set(prog.kernels) >= {
        "conv.winograd_input", "conv", "conv.winograd_output"
    }  # fmt: skip
    tiles = batch * math.prod(-(-o // winograd_s2.TILE) for o in outs)
    if params and min(c, m, tiles) > 1:  # (a dim of 1 leaves no GEMM to schedule)
        prog.schedule("conv").ukernel(**params)
    got = polyonnx.InferenceSession(prog, threads=threads).run(None, {"x": x})[0]
    # the bound of a sum over 81 transformed points a channel
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=4e-5 * 81 * c)


@pytest.mark.parametrize("first", [0, 1], ids=["even", "odd"])
def test_each_phase_tables_give_the_correlation_of_a_window(first):
    """AT [(G g) * (BT d)] is the 4-output valid correlation of a window d with the
    phase's taps g (2 for the even phase, 1 for the odd one)."""
    rng = np.random.default_rng(0)
    phase = winograd_s2.PHASES[first]
    taps = 2 - first
    g, d = rng.standard_normal(taps), rng.standard_normal(phase.size)
    got = phase.at @ ((phase.g @ g) * (phase.bt @ d))
    want = [d[i : i + taps] @ g for i in range(winograd_s2.TILE)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_tile_in_the_transformed_space_is_the_stride_2_convolution():
    """Summed over the four phase pairs, the transformed weights and windows of one tile
    give its 4 x 4 stride-2 outputs from the 9 x 9 padded window."""
    rng = np.random.default_rng(1)
    g, d = rng.standard_normal((3, 3)), rng.standard_normal((9, 9))
    u = winograd_s2.weights_transform(g.reshape(1, 1, 3, 3)).astype(np.float64)[:, 0, 0]
    got = np.zeros((4, 4))
    for rows, cols in winograd_s2.PAIRS:
        base = winograd_s2.first_point((rows, cols))
        points = u[base : base + rows.size * cols.size].reshape(rows.size, cols.size)
        window = d[rows.first :: 2][: rows.size][:, cols.first :: 2][:, : cols.size]
        got += rows.at @ (points * (rows.bt @ window @ cols.bt.T)) @ cols.at.T
    want = [
        [np.sum(d[2 * i : 2 * i + 3, 2 * j : 2 * j + 3] * g) for j in range(4)] for i in range(4)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _fits(c, m, hw, pad=1, stride=2, kernel=3, group=1, dtype="float32"):
    axes = [Axis(hw, kernel, stride, 1, pad, pad, out_size(hw, kernel, stride, 1, pad, pad))]
    x = Buffer("x", (1, c * group, hw, hw), dtype)
    return winograd_s2.fits(x, np.zeros((m, c, kernel, kernel), F32), axes * 2, group)


@pytest.mark.parametrize(
    ("case", "taken"),
    [
        ({"c": 128, "m": 128, "hw": 56}, True),  # ResNet-50's: 49 tiles, 0.56 the work
        ({"c": 64, "m": 128, "hw": 56}, False),  # CHANNEL_PAIRS: 16384
        ({"c": 256, "m": 256, "hw": 28}, False),  # 16 tiles: U read for few columns
        ({"c": 128, "m": 128, "hw": 57}, False),  # 64 tiles for 29 x 29: 0.68 the work
        ({"c": 128, "m": 128, "hw": 64}, True),
        ({"c": 128, "m": 128, "hw": 56, "pad": 2}, False),
        ({"c": 128, "m": 128, "hw": 56, "stride": 1}, False),
        ({"c": 128, "m": 128, "hw": 56, "kernel": 5, "pad": 2}, False),
        ({"c": 128, "m": 128, "hw": 56, "group": 2}, False),
        ({"c": 128, "m": 128, "hw": 56, "dtype": "float16"}, False),
    ],
)
def test_which_convs_take_it(case, taken):
    assert _fits(**case) is taken


def test_its_kernels_and_their_schedules():
    program = lower_model(square_conv_model(128, 128, 56, 3, 2, 1))
    kinds = [(k.name, k.op_type) for k in program.kernels]
    assert kinds == [
        ("conv.winograd_input", "WinogradInput"), ("conv", "Conv"),
        ("conv.winograd_output", "WinogradOutput"),
    ]  # fmt: skip
    assert "w" not in program.constants  # U replaces W
    u = next(b for name, b in program.constants.items() if name.startswith("w_winograd_s2"))
    assert u.shape == (81, 128, 128)
    trees = [default_schedule(k, program.buffers).tree for k in program.kernels]
    assert "ukernel" in trees[1]  # the 81 GEMMs take the micro-kernel
    for tree in (trees[0], trees[2]):  # a channel at a time, the channels on threads
        assert tree.count("parallel") == 1
        assert "vectorize" in tree
