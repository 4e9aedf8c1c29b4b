"""3x3 stride-2 Convs by Winograd over the stride's phases (polyonnx/krnl/ops/winograd_s2.py):
which Convs take it, its tables, its kernels and their default schedules, and the result
against a float64 numpy convolution on hypothesis shapes: odd and prime sizes (tiles
sticking out of the output), pads 0 or 1 at either end, a batch, bias or none, a Relu
after it, with the GEMM's micro-kernel under other parameters and threads."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.krnl.ops import winograd_s2
from polyonnx.runtime.compiled import lower_model
from tests.helpers import fast, seeds, square_conv_model
from tests.krnl.test_winograd import PARAMS, check_conv, fits_case, winograd_trees

F32 = np.float32


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
    case = {"size": size, "pads": pads, "c": c, "m": m, "batch": batch, "bias": bias}
    with _every_3x3_stride_2_conv():
        check_conv(case, 2, winograd_s2.TILE, params, threads, seed, winograd_s2.POINTS)


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
    assert fits_case(winograd_s2.fits, **{"stride": 2, **case}) is taken


def test_its_kernels_and_their_schedules():
    program = lower_model(square_conv_model(128, 128, 56, 3, 2, 1))
    trees = winograd_trees(program)
    u = next(b for name, b in program.constants.items() if name.startswith("w_winograd_s2"))
    assert u.shape == (81, 128, 128)
    assert "ukernel" in trees[1]  # the 81 GEMMs take the micro-kernel
    for tree in (trees[0], trees[2]):  # a channel at a time, the channels on threads
        assert tree.count("parallel") == 1
        assert "vectorize" in tree
