"""A padded stride-1 Conv read in place by the micro-kernel (ukernel packb=0 with taps,
schedule/gemm_taps.py ``b_taps``): no im2col, each tap's vectors loaded under masks that keep
the window inside the image. Checked against numpy on hypothesis shapes and parameters.
Big 3x3 stride-1 Convs take Winograd's path by default (tests/krnl/test_winograd.py);
here they are read in place, as where a script or other rules keep them direct."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.errors import ScheduleError
from polyonnx.krnl.ops import winograd
from polyonnx.runtime.compiled import lower_model
from polyonnx.schedule.gemm import geometry
from polyonnx.schedule.gemm_taps import b_taps, tap_lines, tap_span
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.heuristics.gemm_defaults import default_params
from polyonnx.target import host_target
from tests.helpers import (
    fast,
    make_model,
    random_array,
    seeds,
    square_conv_model,
    sum_tol,
    value_info,
)
from tests.krnl.test_conv import conv_ref

F32 = np.float32


@pytest.fixture(autouse=True, scope="module")
def _direct_convs():
    """No Conv of this module takes Winograd's path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(winograd, "CHANNEL_PAIRS", 1 << 62)
        patch.setattr(winograd, "F4_CHANNEL_PAIRS", 1 << 62)
        yield


# (kernel height, width, dilation): "same" padding keeps the output as large as the input
WINDOWS = (
    (3, 3, 1), (3, 3, 2), (1, 3, 1), (3, 1, 1), (2, 2, 1), (2, 3, 1), (5, 5, 1), (3, 5, 1),
    (7, 7, 1), (5, 7, 1),
)  # fmt: skip


def _same_pads(kh: int, kw: int, dilation: int) -> list[int]:
    """ONNX pads (top, left, bottom, right) that keep a stride-1 output the input's size."""
    th, tw = dilation * (kh - 1), dilation * (kw - 1)
    return [th // 2, tw // 2, th - th // 2, tw - tw // 2]


def _reference(x, w, bias, pads, dilation, group):
    """Grouped stride-1 convolution in float64 numpy, asymmetric zero padding."""
    n, _, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out = np.zeros((n, m, h, wd))
    per = m // group
    for o in range(m):
        g = o // per
        for i in range(kh):
            for j in range(kw):
                window = xp[:, g * cg : (g + 1) * cg, i * dilation : i * dilation + h,
                            j * dilation : j * dilation + wd]  # fmt: skip
                out[:, o] += np.einsum("nchw,c->nhw", window, w[o, :, i, j])
    return (out + bias[None, :, None, None]).astype(F32)


def _conv_model(x_shape, w, bias, pads, dilation, group, residual: bool):
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], name="conv",
            pads=pads, dilations=[dilation] * 2, group=group,
        )
    ]  # fmt: skip
    inputs = [value_info("x", F32, x_shape)]
    out_shape = (x_shape[0], w.shape[0], *x_shape[2:])
    if residual:
        inputs.append(value_info("r", F32, out_shape))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"], name="add"))
    nodes.append(helper.make_node("Relu", ["s" if residual else "c"], ["y"], name="relu"))
    return make_model(nodes, inputs, [value_info("y", F32, out_shape)], {"w": w, "b": bias})


@fast(30)
@given(
    c=st.sampled_from((1, 2, 3, 5, 17)),
    m=st.sampled_from((2, 3, 8, 9, 33)),
    h=st.sampled_from((3, 5, 7, 13)),
    wd=st.sampled_from((3, 7, 16, 17, 31, 33)),
    window=st.sampled_from(WINDOWS),
    group=st.sampled_from((1, 2)),
    residual=st.booleans(),
    mr=st.sampled_from((1, 3, 8)),
    nr=st.sampled_from((16, 32, 48)),
    channels=st.sampled_from((1, 2, 5)),
    mc=st.sampled_from((1, 5, 64)),
    nc=st.sampled_from((16, 40, 512)),
    split=st.sampled_from(("none", "rows", "cols")),
    packa=st.sampled_from((0, 1)),
    prefetch=st.sampled_from((0, 1)),
    seed=seeds,
)
def test_a_conv_read_in_place_matches_numpy(
    c, m, h, wd, window, group, residual, mr, nr, channels, mc, nc, split, packa, prefetch, seed
):
    kh, kw, dilation = window
    # every tap reaches the image from some output (else the sum is no GEMM: a 7x7 window
    # on 3 rows has taps that read only padding)
    assume(h > dilation * (kh - 1) // 2 and wd > dilation * (kw - 1) // 2)
    m *= group  # m output channels a group
    rng = np.random.default_rng(seed)
    x = random_array(rng, (1, c * group, h, wd))
    w = random_array(rng, (m, c, kh, kw))
    bias = random_array(rng, (m,))
    pads = _same_pads(kh, kw, dilation)
    model = _conv_model(x.shape, w, bias, pads, dilation, group, residual)
    feed = {"x": x}
    ref = _reference(x, w, bias, pads, dilation, group)
    if residual:
        feed["r"] = random_array(rng, ref.shape)
        ref = ref + feed["r"]
    prog = polyonnx.load(model)
    kc = channels * kh * kw  # whole windows
    prog.schedule("conv").ukernel(
        mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, split=split, packa=packa, packb=0, prefetch=prefetch
    )
    got = polyonnx.InferenceSession(prog, threads=2).run(None, feed)[0]
    np.testing.assert_allclose(got, np.maximum(ref, 0), **sum_tol(16 * c * kh * kw))


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (square_conv_model(8, 16, 9, 3, stride=2), "packb=0 needs B contiguous"),  # rows step 2
        (square_conv_model(8, 16, 9, 3, pad=0), "packb=0 needs B contiguous"),  # rows 7 of 9 long
        (square_conv_model(8, 16, 11, 9, pad=4), "packb=0 needs B contiguous"),  # 81 taps
    ],
)
def test_reading_a_conv_in_place_is_refused_where_it_does_not_apply(model, reason):
    s = polyonnx.load(model).schedule("conv")
    with pytest.raises(ScheduleError, match=reason):
        s.ukernel(packb=0)
    s.ukernel(packb=1)


def test_a_conv_read_in_place_takes_whole_windows():
    s = polyonnx.load(square_conv_model(8, 16, 9, 3)).schedule("conv")
    with pytest.raises(ScheduleError, match="multiple of the 9 taps"):
        s.ukernel(packb=0, kc=32)
    s.ukernel(packb=0, kc=36)


@pytest.mark.parametrize(
    ("c", "m", "hw", "stride", "in_place"),
    [
        (64, 64, 56, 1, True),
        (128, 32, 7, 1, True),
        (512, 512, 7, 1, True),  # 49 columns: the 49th a dot product
        (64, 128, 56, 2, True),  # strided: over its phases (krnl/ops/phases.py)
        (64, 128, 56, 3, False),  # stride 3: 36 slots for 9 taps, packed from the input
    ],
)
def test_the_default_reads_a_3x3_conv_in_place(c, m, hw, stride, in_place):
    program = lower_model(square_conv_model(c, m, hw, 3, stride=stride))
    (kernel,) = program.kernels
    tree = default_schedule(kernel, program.buffers).tree
    assert ("packb0" in tree) == in_place


@pytest.mark.parametrize(("lanes", "registers"), [(8, 16), (16, 32)])
@pytest.mark.parametrize("k", [5, 7])
def test_5x5_and_7x7_convs_are_read_in_place_by_default(lanes, registers, k):
    program = lower_model(square_conv_model(32, 64, 13, k, pad=k // 2))
    (kernel,) = program.kernels
    (stmt,) = [st for st in kernel.statements if geometry(st, program.buffers)]
    params = default_params(geometry(stmt, program.buffers), lanes, registers)
    assert params.packb == 0


@pytest.mark.parametrize(("k", "rolled"), [(3, False), (5, True), (7, True)])
def test_windows_of_more_than_9_taps_run_them_as_a_loop(k, rolled):
    """With AVX-512 (this host's ISA if it has it), a window past ROLLED_TAPS taps runs
    them as a loop over tables, with its masks from the stack; the results match."""
    if host_target().lanes(4) < 16:
        pytest.skip("the taps run as a loop with AVX-512 only; this host has no AVX-512")
    rng = np.random.default_rng(k)
    x = random_array(rng, (1, 5, 20, 21))
    w = random_array(rng, (24, 5, k, k))
    bias = random_array(rng, (24,))
    pads = _same_pads(k, k, 1)
    model = _conv_model(x.shape, w, bias, pads, 1, 1, residual=False)
    session = polyonnx.InferenceSession(model, threads=1)
    source = session.compiled_for({"x": x}).jit.source
    assert ("tap.head" in source) == rolled
    assert ("tap.masks" in source) == rolled  # some tiles reach into the padding
    got = session.run(None, {"x": x})[0]
    ref = _reference(x, w, bias, pads, 1, 1)
    np.testing.assert_allclose(got, np.maximum(ref, 0), **sum_tol(5 * k * k))


@pytest.mark.parametrize(
    ("c", "m", "hw", "split"),
    [
        (256, 256, 14, "rows"),  # weights of 2.4 MB: each thread reads half
        (128, 128, 28, "cols"),  # 0.6 MB
        (64, 64, 56, "cols"),
    ],
)
def test_a_conv_read_in_place_with_big_weights_splits_its_rows(c, m, hw, split):
    program = lower_model(square_conv_model(c, m, hw, 3))
    (kernel,) = program.kernels
    assert f"split{split}" in default_schedule(kernel, program.buffers).tree


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("params", [None, {"packb": 1}])
def test_a_conv_with_an_output_row_in_its_padding_is_exact(stride, params):
    """Pads as large as the kernel: the last output row reads only padding (its value is
    the bias), so the update's domain has a row fewer than the output. The GEMM must not
    take the output's shape from the update: it would leave that row uninitialised."""
    rng = np.random.default_rng(0)
    x = random_array(rng, (1, 16, 24, 29))
    w = random_array(rng, (32, 16, 2, 3))
    bias = random_array(rng, (32,))
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], name="conv", pads=[0, 1, 2, 1], strides=[1, stride]
    )
    out = (1, 32, 25, (29 + 2 - 3) // stride + 1)
    model = make_model(
        [node], [value_info("x", F32, x.shape)], [value_info("y", F32, out)], {"w": w, "b": bias}
    )
    prog = polyonnx.load(model)
    if params is not None:
        with pytest.raises(ScheduleError, match="exactly one float32 contraction"):
            prog.schedule("conv").ukernel(**params)
    got = polyonnx.InferenceSession(prog, threads=2).run(None, {"x": x})[0]
    ref = conv_ref(x, w, bias, 1, (1, stride), (1, 1), (0, 1), out[2:])
    np.testing.assert_allclose(got, ref, **sum_tol(16 * 6))


def test_a_tile_whose_windows_lie_inside_the_image_reads_without_masks():
    # 40 x 40: a 16-column tile inside a row, away from the top and bottom rows, has every
    # tap's window inside; the tiles at the edges keep their masks
    rng = np.random.default_rng(11)
    x = random_array(rng, (1, 16, 40, 40))
    w = random_array(rng, (24, 16, 3, 3))
    bias = random_array(rng, (24,))
    pads = _same_pads(3, 3, 1)
    model = _conv_model(x.shape, w, bias, pads, 1, 1, residual=False)
    session = polyonnx.InferenceSession(model, threads=2)
    source = session.compiled_for({"x": x}).jit.source
    assert "taps.inside" in source and "taps.plane.yes" in source
    got = session.run(None, {"x": x})[0]
    ref = _reference(x, w, bias, pads, 1, 1)
    np.testing.assert_allclose(got, np.maximum(ref, 0), **sum_tol(16 * 9))


@pytest.mark.parametrize(
    ("h", "wd", "window"),
    [(56, 56, (3, 3, 1)), (7, 9, (3, 3, 1)), (14, 14, (3, 3, 2)), (5, 8, (2, 3, 1))],
)
def test_the_tap_span_is_the_input_plane(h, wd, window):
    """Tiles whose every tap row lies between the lowest and highest element the domain
    reads load all their lanes unmasked (then zero the masked ones): that range must be
    the input plane exactly, or a load could leave the buffer."""
    kh, kw, dilation = window
    rng = np.random.default_rng(0)
    w = random_array(rng, (4, 3, kh, kw))
    model = _conv_model((1, 3, h, wd), w, np.zeros(4, F32), _same_pads(kh, kw, dilation),
                        dilation, 1, residual=False)  # fmt: skip
    program = lower_model(model)
    stmt = next(s for k in program.kernels for s in k.statements if s.reduce == "add")
    geo = geometry(stmt, program.buffers)
    taps = b_taps(geo)
    low, high = tap_span(geo, taps)
    # the first element of the plane, then the last, from B's base (the padding's shift)
    assert (geo.b.const + low, geo.b.const + high) == (0, h * wd - 1)


@given(
    hw=st.sampled_from((5, 7, 14, 17, 56)),
    window=st.sampled_from(WINDOWS),
    nr=st.sampled_from((8, 16, 32)),
)
def test_the_lines_a_tile_prefetches_cover_what_its_taps_read(hw, window, nr):
    """``tap_lines``: disjoint ranges that hold every element an NR-wide tile reads
    through its live taps, and no more than a line past a window row's."""
    kh, kw, dilation = window
    w, bias = np.ones((8, 4, kh, kw), F32), np.zeros(8, F32)
    pads = _same_pads(kh, kw, dilation)
    program = lower_model(_conv_model((1, 4, hw, hw), w, bias, pads, dilation, 1, False))
    stmt = next(s for k in program.kernels for s in k.statements if s.reduce)
    taps = b_taps(geometry(stmt, program.buffers))
    ranges = tap_lines(taps, nr)
    read = {taps.offsets[t] + lane for t in taps.live for lane in range(nr)}
    assert all(any(lo <= x <= hi for lo, hi in ranges) for x in read)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    assert sum(hi - lo + 1 for lo, hi in ranges) <= len(read) + nr * len(ranges)


@pytest.mark.parametrize(
    ("c", "hw", "lanes", "prefetch"),
    [
        (64, 56, 8, 1),
        (128, 28, 8, 1),
        (512, 14, 8, 1),  # a 16-column tile reads 4 rows of 14
        (512, 14, 16, 0),  # AVX-512: not measured there
    ],
)
def test_avx2_prefetches_b_of_a_conv_read_in_place(c, hw, lanes, prefetch):
    program = lower_model(square_conv_model(c, c, hw, 3))
    stmt = next(s for s in program.kernels[0].statements if s.reduce)
    params = default_params(geometry(stmt, program.buffers), lanes, 16 if lanes == 8 else 32)
    assert (params.packb, params.prefetch) == (0, prefetch)
