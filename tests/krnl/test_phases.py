"""A strided Conv over the stride phases of its input (polyonnx/krnl/ops/phases.py): the
lowering, its default schedule (the micro-kernel reads the phase copy in place and skips
the slots that are no tap) and the micro-kernel's other parameters, against a float64
numpy convolution on hypothesis shapes: odd sizes, asymmetric pads, strides 2 and 3,
groups, a batch, with a residual Add and a Relu fused after it."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.krnl.ir import Buffer
from polyonnx.krnl.ops import phases
from polyonnx.krnl.ops.conv import Axis
from polyonnx.runtime.compiled import lower_model
from polyonnx.schedule.heuristics.default import default_schedule
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
from tests.krnl.test_conv import conv_ref, out_size

F32 = np.float32


def _axes(size, kernel, stride, begin, end):
    return tuple(
        Axis(n, k, s, 1, b, e, out_size(n, k, s, 1, b, e))
        for n, k, s, b, e in zip(size, kernel, stride, begin, end, strict=True)
    )


def _phased(size, kernel, stride, begin, end, channels=16) -> bool:
    x = Buffer("x", (1, channels, *size), "float32")
    weights = np.zeros((1, channels, *kernel), F32)
    return phases.plan(_axes(size, kernel, stride, begin, end), x, weights) is not None


WINDOWS = [
    (size, kernel, stride, begin, end)
    for size in ((24, 29), (31, 24), (25, 40), (37, 37))
    for kernel, stride in (
        ((3, 3), (2, 2)), ((2, 2), (2, 2)), ((3, 2), (2, 2)), ((3, 3), (3, 3)),
        ((3, 3), (2, 1)), ((3, 1), (3, 1)), ((2, 3), (1, 2)), ((7, 7), (2, 2)),
        ((5, 5), (2, 2)), ((5, 3), (2, 2)),
    )
    for begin in ((1, 1), (0, 1), (1, 0), (2, 2))
    for end in ((1, 1), (0, 0), (2, 1))
    if _phased(size, kernel, stride, begin, end)
    and all(b < k and e < k for b, e, k in zip(begin, end, kernel, strict=True))
]  # fmt: skip
"""Every strided window (input size, kernel, stride, pads at the start and at the end)
of this grid that runs over phases, with every output reaching into the input (else it is
no GEMM: tests/schedule/test_direct_conv.py)."""


def _model(x_shape, w, bias, pads, strides, group, residual: bool, out_shape):
    inputs = ["x", "w", "b"] if bias is not None else ["x", "w"]
    nodes = [helper.make_node("Conv", inputs, ["c"], name="conv", pads=pads, strides=strides,
                              group=group)]  # fmt: skip
    feeds = [value_info("x", F32, x_shape)]
    if residual:
        feeds.append(value_info("r", F32, out_shape))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"], name="add"))
    nodes.append(helper.make_node("Relu", ["s" if residual else "c"], ["y"], name="relu"))
    constants = {"w": w} if bias is None else {"w": w, "b": bias}
    return make_model(nodes, feeds, [value_info("y", F32, out_shape)], constants)


PARAMS = [{}, {"packb": 1}, {"packb": 1, "mr": 3, "nr": 48, "split": "rows"},
          {"mr": 5, "nr": 32, "mc": 5, "nc": 40, "split": "cols"}, {"packa": 1}]  # fmt: skip
"""The micro-kernel's parameters besides the default: packing the phase copy (the slots
that are no tap then multiply zeros), other register tiles, blocks and thread splits."""


@fast(30)
@given(
    window=st.sampled_from(WINDOWS),
    c=st.sampled_from((16, 17)),
    m=st.sampled_from((2, 3, 16, 33)),
    group=st.sampled_from((1, 2)),
    batch=st.sampled_from((1, 2)),
    bias=st.booleans(),
    residual=st.booleans(),
    params=st.sampled_from(PARAMS),
    channels=st.sampled_from((1, 3)),
    threads=st.sampled_from((1, 2)),
    seed=seeds,
)
def test_a_strided_conv_over_phases_matches_numpy(
    window, c, m, group, batch, bias, residual, params, channels, threads, seed
):
    size, kernel, stride, begin, end = window
    rng = np.random.default_rng(seed)
    x = random_array(rng, (batch, c * group, *size))
    w = random_array(rng, (m * group, c, *kernel))
    b = random_array(rng, (m * group,)) if bias else None
    outs = [a.out for a in _axes(size, kernel, stride, begin, end)]
    ref = conv_ref(x, w, b, group, stride, (1, 1), begin, outs)
    feed = {"x": x}
    if residual:
        feed["r"] = random_array(rng, ref.shape)
        ref = ref + feed["r"]
    model = _model(x.shape, w, b, [*begin, *end], stride, group, residual, ref.shape)
    prog = polyonnx.load(model)
    if params:  # kc: whole windows of slots
        plan = phases.plan(
            _axes(size, kernel, stride, begin, end), Buffer("x", x.shape, "float32"), w
        )
        slots = np.prod([p.axis.stride * p.offsets for p in plan])
        prog.schedule("conv").ukernel(kc=int(channels * slots), **params)
    got = polyonnx.InferenceSession(prog, threads=threads).run(None, feed)[0]
    np.testing.assert_allclose(got, np.maximum(ref, 0), **sum_tol(16 * c * np.prod(kernel)))


@pytest.mark.parametrize(
    ("c", "hw", "k", "stride", "pad", "phased"),
    [
        (128, 56, 3, 2, 1, True),  # ResNet-50's: 784 columns
        (64, 57, 3, 2, 1, True),
        (512, 14, 3, 2, 1, False),  # 49 columns (MIN_PLANE)
        (3, 224, 3, 2, 1, False),  # a stem's 3 channels x 9 taps (MIN_WINDOW_DEPTH)
        (3, 224, 7, 2, 3, True),  # ResNet-50's stem: 3 x 49
        (64, 56, 5, 2, 2, True),
        (64, 56, 3, 2, 0, False),  # no padding: a row of the copy would be 28, not 27
        (3, 224, 11, 4, 2, False),  # 121 taps (MAX_TAPS)
        (64, 56, 1, 2, 0, False),  # 1x1: 3 of 4 phases unread
        (64, 56, 3, 1, 1, False),  # stride 1
    ],
)
def test_which_convs_run_over_phases(c, hw, k, stride, pad, phased):
    program = lower_model(square_conv_model(c, 16, hw, k, stride, pad))
    (kernel,) = program.kernels
    copies = [s for s in kernel.statements if ".phases" in s.write.buffer]
    assert bool(copies) == phased
    assert ("w" in program.constants) != phased  # V replaces W
    tree = default_schedule(kernel, program.buffers).tree
    if phased:  # the copy on threads, the GEMM reads it in place
        assert "packb0" in tree
        assert "parallel" in tree


def test_tiles_inside_the_image_take_the_loop_without_masks():
    """The test for a tile whose every tap lies inside the image ANDs the live taps' masks
    only: a slot that is no tap has all lanes off, and with it the test folded to false, so
    every tile took the masked loop. The optimised code keeps the test (all lanes on)."""
    model = square_conv_model(16, 16, 40, 3, stride=2, pad=1)
    x = np.zeros((1, 16, 40, 40), F32)
    session = polyonnx.InferenceSession(model, threads=1)
    optimized = session.compiled_for({model.graph.input[0].name: x}).jit.optimized
    lanes = host_target().lanes(4)
    assert re.search(rf"icmp eq i{lanes} %[\w.]+, -1", optimized)


def test_slots_that_are_no_tap_hold_zeros_and_rows_avoid_aliasing():
    axes = _axes((56, 56), (3, 3), (2, 2), (1, 1), (1, 1))
    w = np.arange(2 * 128 * 9, dtype=F32).reshape(2, 128, 3, 3) + 1
    plan = phases.plan(axes, Buffer("x", (1, 128, 56, 56), "float32"), w)
    v = phases.slot_weights(w, plan)
    assert v.shape == (2, 129, 2, 2, 2, 2)  # a row of 128 x 16 floats is 8 KB: one more
    assert not v[:, 128].any()
    for a0, a1, e0, e1 in itertools.product(range(2), repeat=4):
        k0, k1 = plan[0].slot_tap(a0, e0), plan[1].slot_tap(a1, e1)
        got = v[:, :128, a0, a1, e0, e1]
        if k0 is None or k1 is None:
            assert not got.any()
        else:
            np.testing.assert_array_equal(got, w[:, :, k0, k1])
    assert np.count_nonzero(v[0, 0]) == 9
