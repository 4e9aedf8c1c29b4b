"""3x3 stride-1 Convs by Winograd F(2x2, 3x3) and F(4x4, 3x3)
(polyonnx/krnl/ops/winograd.py): which Convs take which, the three kernels and their
default schedules, and the result against a float64 numpy convolution on hypothesis
shapes: odd and prime sizes (tiles sticking out of the output), pads 0 or 1 at either
end, a batch, bias or none, a Relu after it, with the GEMM's micro-kernel under other
parameters and threads."""

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
from polyonnx.krnl.ops import winograd
from polyonnx.krnl.ops.conv import Axis
from polyonnx.runtime.compiled import lower_model
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.target import host_target
from tests.helpers import fast, make_model, random_array, seeds, square_conv_model, value_info
from tests.krnl.test_conv import conv_ref, out_size

F32 = np.float32
F2, F4 = winograd.F2, winograd.F4


def conv_relu_model(x_shape, w, bias, pads, out_shape, stride=1):
    """Conv ("conv", constant weights and bias, or none) then Relu."""
    inputs = ["x", "w", "b"] if bias is not None else ["x", "w"]
    nodes = [
        helper.make_node("Conv", inputs, ["c"], name="conv", pads=pads, strides=[stride, stride]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    constants = {"w": w} if bias is None else {"w": w, "b": bias}
    feeds = [value_info("x", F32, x_shape)]
    return make_model(nodes, feeds, [value_info("y", F32, out_shape)], constants)


@contextlib.contextmanager
def _every_3x3_conv(variant=winograd.F2):
    """Winograd's ``variant`` for every 3x3 stride-1 Conv, however few its channels and
    tiles."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(winograd, "CHANNEL_PAIRS", 1)
        patch.setattr(winograd, "F4_CHANNEL_PAIRS", 1 if variant is winograd.F4 else 1 << 40)
        patch.setattr(winograd, "F4_PLANE", 1)
        patch.setattr(winograd, "TILE_WORK", 100.0)
        yield


LANES = host_target().lanes()
PARAMS = [
    {},
    {"mr": 3, "nr": LANES, "kc": 5, "split": "rows"},
    {"packb": 1, "split": "cols"},
]
"""The GEMM kernel's micro-kernel parameters besides the default: a short tile one vector
wide and K blocks that split the channels, B packed."""


@fast(25)
@given(
    size=st.tuples(st.sampled_from((1, 2, 3, 5, 8, 13)), st.sampled_from((1, 2, 4, 7, 11))),
    pads=st.tuples(*[st.integers(0, 1)] * 4),
    c=st.sampled_from((1, 3, 16)),
    m=st.sampled_from((1, 5, 17)),
    batch=st.sampled_from((1, 2)),
    bias=st.booleans(),
    params=st.sampled_from(PARAMS),
    threads=st.sampled_from((1, 2)),
    variant=st.sampled_from((winograd.F2, winograd.F4)),
    seed=seeds,
)
def test_a_winograd_conv_matches_numpy(
    size, pads, c, m, batch, bias, params, threads, variant, seed
):
    case = {"size": size, "pads": pads, "c": c, "m": m, "batch": batch, "bias": bias}
    with _every_3x3_conv(variant):
        check_conv(case, 1, variant.tile, params, threads, seed)


def check_conv(case, stride, tile, params, threads, seed, points=36):
    """A 3x3 Conv then Relu (``case``: input size, pads, channels c -> m, batch, bias or
    not) taken by Winograd, ``tile`` outputs a tile side, against a float64 numpy
    convolution, its GEMM under ukernel ``params``, on ``threads``."""
    begin, end = case["pads"][:2], case["pads"][2:]
    outs = [
        out_size(n, 3, stride, 1, b, e) for n, b, e in zip(case["size"], begin, end, strict=True)
    ]
    if min(outs) < 1:
        return  # the window does not fit: a load-time error (tests/krnl/test_conv.py)
    rng = np.random.default_rng(seed)
    c, m = case["c"], case["m"]
    x = random_array(rng, (case["batch"], c, *case["size"]))
    w = random_array(rng, (m, c, 3, 3))
    b = random_array(rng, (m,)) if case["bias"] else None
    ref = np.maximum(conv_ref(x, w, b, 1, (stride, stride), (1, 1), begin, outs), 0)
    model = conv_relu_model(x.shape, w, b, list(case["pads"]), ref.shape, stride)
    prog = polyonnx.load(model)
    assert set(prog.kernels) >= {
        "conv.winograd_input", "conv", "conv.winograd_output"
    }  # fmt: skip
    tiles = case["batch"] * math.prod(-(-o // tile) for o in outs)
    if params and min(c, m, tiles) > 1:  # (a dim of 1 leaves no GEMM to schedule)
        prog.schedule("conv").ukernel(**params)
    got = polyonnx.InferenceSession(prog, threads=threads).run(None, {"x": x})[0]
    # the bound of a sum over the transformed points a channel (36 for F(4x4, 3x3); F2 and
    # F4 both pass within it)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=4e-5 * points * c)


@pytest.mark.parametrize("variant", [winograd.F2, winograd.F4], ids=["F2", "F4"])
def test_the_transformed_weights_give_the_direct_convolution_of_a_tile(variant):
    """(AT [(G g G^T) * (BT d BT^T)] AT^T) is the s x s valid convolution (correlation)
    of a w x w window d with a 3x3 filter g."""
    rng = np.random.default_rng(0)
    s, w = variant.tile, variant.window
    g, d = rng.standard_normal((3, 3)), rng.standard_normal((w, w))
    u = winograd.weights_transform(g.reshape(1, 1, 3, 3), variant).reshape(w, w)
    got = variant.at @ (u * (variant.bt @ d @ variant.bt.T)) @ variant.at.T
    want = [[np.sum(d[i : i + 3, j : j + 3] * g) for j in range(s)] for i in range(s)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def fits_case(fits, c, m, hw, pad=1, stride=1, kernel=3, group=1, dtype="float32"):
    """``fits`` (a Winograd lowering's) of a square Conv c -> m channels at hw x hw."""
    axes = [Axis(hw, kernel, stride, 1, pad, pad, out_size(hw, kernel, stride, 1, pad, pad))]
    x = Buffer("x", (1, c * group, hw, hw), dtype)
    return fits(x, np.zeros((m, c, kernel, kernel), F32), axes * 2, group)


@pytest.mark.parametrize(
    ("case", "taken"),
    [
        ({"c": 256, "m": 256, "hw": 14}, F2),  # ResNet-50's: 14 < F4_PLANE
        ({"c": 64, "m": 64, "hw": 56}, F4),  # F4_CHANNEL_PAIRS: 4096
        ({"c": 64, "m": 32, "hw": 56}, None),  # 2048: the transforms cost what it saves
        ({"c": 64, "m": 64, "hw": 14}, None),  # too small for F4, too few pairs for F2
        ({"c": 64, "m": 128, "hw": 14}, F2),  # CHANNEL_PAIRS: 8192
        ({"c": 512, "m": 512, "hw": 7}, F2),  # 16 tiles for 49 outputs: 0.58 the work
        ({"c": 512, "m": 512, "hw": 5}, None),  # 9 for 25: 0.64 (TILE_WORK)
        ({"c": 256, "m": 256, "hw": 17}, F4),  # 25 tiles of 16 for 289 outputs: 0.35
        ({"c": 256, "m": 256, "hw": 14, "pad": 2}, None),
        ({"c": 256, "m": 256, "hw": 14, "stride": 2}, None),
        ({"c": 256, "m": 256, "hw": 14, "kernel": 5, "pad": 2}, None),
        ({"c": 128, "m": 256, "hw": 14, "group": 2}, None),
        ({"c": 256, "m": 256, "hw": 14, "dtype": "float16"}, None),
    ],
)
def test_which_convs_take_winograd(case, taken):
    assert fits_case(winograd.fits, **case) is taken


def winograd_trees(program) -> list[str]:
    """The default schedule trees of a Winograd Conv's three kernels (the Conv named
    "conv"), checked to be those three, with U in place of the weights W."""
    kinds = [(k.name, k.op_type) for k in program.kernels]
    assert kinds == [
        ("conv.winograd_input", "WinogradInput"), ("conv", "Conv"),
        ("conv.winograd_output", "WinogradOutput"),
    ]  # fmt: skip
    assert "w" not in program.constants
    return [default_schedule(k, program.buffers).tree for k in program.kernels]


def test_its_kernels_and_their_schedules():
    program = lower_model(square_conv_model(128, 64, 14, 3, 1, 1))
    trees = winograd_trees(program)
    u = next(b for name, b in program.constants.items() if name.startswith("w_winograd"))
    assert u.shape == (16, 64, 128)
    assert "ukernel" in trees[1]  # the 16 GEMMs take the micro-kernel
    assert "vectorize" in trees[0]  # along the tiles of a row
    # both passes of the output transform in vectors: along its rows, then down its
    # columns (written every other column, stored a lane at a time)
    assert trees[2].count("vectorize") == 4
    for tree in (trees[0], trees[2]):  # a channel at a time, the channels on threads
        assert tree.count("parallel") == 1


def test_a_4x4_tile_conv_has_36_gemms_and_vector_transforms():
    program = lower_model(square_conv_model(64, 64, 28, 3, 1, 1))
    u = next(b for name, b in program.constants.items() if name.startswith("w_winograd"))
    assert u.shape == (36, 64, 64)
    trees = [default_schedule(k, program.buffers).tree for k in program.kernels]
    assert "ukernel" in trees[1]
    assert trees[0].count("vectorize") == 2 + 6 + 6  # the copy, down, across
    assert trees[2].count("vectorize") == 8
