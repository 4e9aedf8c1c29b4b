"""The depthwise schedule (schedule/heuristics/depthwise.py): which kernels take it, and depthwise
convolutions against numpy on hypothesis shapes (odd and prime widths, rows wide enough
for the schedule, strides, pads, dilations, channel multipliers, bias)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.krnl.ir import Buffer
from polyonnx.schedule.heuristics.depthwise import depthwise_schedule
from tests.helpers import check_node, const, conv2d_reference, fast, sum_tol


@fast(20)
@given(
    channels=st.sampled_from([1, 2, 3, 5]),
    multiplier=st.sampled_from([1, 2]),
    height=st.sampled_from([1, 2, 5, 7]),
    width=st.sampled_from([1, 7, 13, 17, 31, 64, 67, 97]),
    kernel=st.sampled_from([1, 3, 5]),
    stride=st.sampled_from([1, 2]),
    pad=st.sampled_from([0, 1, 2]),
    dilation=st.sampled_from([1, 2]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_depthwise_conv_matches_numpy(
    channels, multiplier, height, width, kernel, stride, pad, dilation, bias, seed
):
    span = dilation * (kernel - 1) + 1
    if height + 2 * pad < span or width + 2 * pad < span:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, channels, height, width)).astype(np.float32)
    w = rng.standard_normal((channels * multiplier, 1, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(channels * multiplier).astype(np.float32) if bias else None
    want = conv2d_reference(x, w, b, stride, pad, dilation, channels)
    args = [x, const(w)] + ([const(b)] if bias else [])
    check_node(
        "Conv", args, want, tol=sum_tol(kernel * kernel), kernel_shape=[kernel, kernel],
        strides=[stride, stride], pads=[pad] * 4, dilations=[dilation, dilation],
        group=channels,
    )  # fmt: skip


def _kernel(c_in: int, group: int, width: int, stride: int = 1):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from polyonnx.runtime.compiled import lower_model

    out = (width + 2 - 3) // stride + 1
    w = np.ones((c_in, c_in // group, 3, 3), np.float32)
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4, strides=[stride] * 2,
        group=group,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 8, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_in, 8, out])],
        initializer=[numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    program = lower_model(model)
    (kernel,) = program.kernels
    return kernel, program.buffers


def test_depthwise_schedule_takes_wide_rows():
    kernel, buffers = _kernel(4, 4, 112)
    chosen = depthwise_schedule(kernel, buffers, 16)
    assert chosen is not None
    assert "isolate" in chosen.tree


def test_depthwise_schedule_takes_strided_rows_of_a_vector():
    kernel, buffers = _kernel(4, 4, 112, stride=2)  # rows of 56 (shorter: conv.PHASED_ROW)
    assert depthwise_schedule(kernel, buffers, 16) is not None


def test_depthwise_schedule_leaves_short_rows():
    kernel, buffers = _kernel(4, 4, 28)
    assert depthwise_schedule(kernel, buffers, 16) is None


def test_depthwise_schedule_leaves_contractions():
    kernel, buffers = _kernel(4, 1, 112)  # a reduction over input channels
    assert depthwise_schedule(kernel, buffers, 16) is None
    kernel, buffers = _kernel(4, 2, 112)  # two input channels per group
    assert depthwise_schedule(kernel, buffers, 16) is None
    assert isinstance(next(iter(buffers.values())), Buffer)


@fast(12)
@given(
    channels=st.sampled_from([1, 3]),
    multiplier=st.sampled_from([1, 2]),
    height=st.sampled_from([1, 4, 7]),
    width=st.sampled_from([5, 14, 28, 31, 64, 67, 97]),
    kernel=st.sampled_from([3, 5]),
    pads=st.tuples(*[st.integers(0, 2)] * 4),
    dilation=st.sampled_from([1, 2]),
    stride=st.sampled_from([1, 1, 2, 3]),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_padded_depthwise_convs_read_a_zero_padded_copy(
    channels, multiplier, height, width, kernel, pads, dilation, stride, threads, seed
):
    """A padded stride-1 depthwise Conv reads a zero-padded copy of its input: rows of 64
    outputs and more in the depthwise schedule (no taps left out at the rows' ends),
    shorter ones (one output channel a group) as one sum of taps per output along the
    flattened plane; strided ones with short rows over the stride phases of the padded
    input. Asymmetric pads, odd widths, dilations, a second run over the first run's
    (poisoned) memory."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import polyonnx
    from polyonnx.runtime.compiled import lower_model

    top, left, bottom, right = pads
    span = dilation * (kernel - 1) + 1
    out_h = (height + top + bottom - span) // stride + 1
    out_w = (width + left + right - span) // stride + 1
    if out_h < 1 or out_w < 1:
        return
    rng = np.random.default_rng(seed)
    m = channels * multiplier
    x = rng.standard_normal((1, channels, height, width)).astype(np.float32) - 1.0
    w = rng.standard_normal((m, 1, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], kernel_shape=[kernel, kernel], strides=[stride] * 2,
        pads=[top, left, bottom, right], dilations=[dilation, dilation], group=channels,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, out_h, out_w])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    (conv,) = lower_model(model).kernels
    writes = {s.write.buffer.split(".")[1] for s in conv.statements if "." in s.write.buffer}
    depthwise = channels > 1  # group 1: a plain Conv
    if stride == 1:
        flat = depthwise and any(pads) and out_w < 64 and multiplier == 1
        assert ("padded" in writes) == (depthwise and any(pads) and (out_w >= 64 or flat))
    else:
        short = out_w < 48 or kernel * kernel >= 4 * stride * stride
        flat = depthwise and multiplier == 1 and short
        assert ("phases" in writes) == flat
    assert ("flat" in writes) == flat
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    want = conv2d_reference(padded, w, b, stride, 0, dilation, channels)
    session = polyonnx.InferenceSession(model, threads=threads)
    for _ in range(2):
        got = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, **sum_tol(kernel * kernel))


def test_short_row_depthwise_runs_a_channel_at_a_time_where_planes_fit():
    from polyonnx.schedule.heuristics.default import default_schedule

    for width, fused in ((28, True), (7, False)):  # 8 rows: 238-point and 70-point passes
        kernel, buffers = _kernel(16, 16, width)
        assert any(".flat" in s.write.buffer for s in kernel.statements)
        schedule = default_schedule(kernel, buffers, 16)
        attached = len(schedule.state.attach) == len(kernel.statements) - 1
        assert attached == fused, width
