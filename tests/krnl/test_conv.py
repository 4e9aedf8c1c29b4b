"""Convolution lowerings (polyonnx/krnl/ops/conv.py): Conv, ConvInteger and ConvTranspose
in 1-D, 2-D and 3-D, grouped and depthwise, with every padding mode, against float64
numpy references (an explicit zero-padded input; ConvTranspose as a scatter, the opposite
of the gather the lowering uses)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx
from polyonnx.frontend import load_graph
from polyonnx.krnl.lower import lower
from tests.helpers import check_node, const, fast, node_model, random_array, seeds, sum_tol

# ---- references ---------------------------------------------------------------------------


def out_size(size, k, s, d, begin, end):
    return (size + begin + end - d * (k - 1) - 1) // s + 1


def same_pads(size, k, s, d, mode):
    """(begin, end, out) of auto_pad SAME_UPPER / SAME_LOWER, as the ONNX spec gives them."""
    out = -(-size // s)
    total = max(0, (out - 1) * s + d * (k - 1) + 1 - size)
    small, big = total // 2, total - total // 2
    return (small, big, out) if mode == "SAME_UPPER" else (big, small, out)


def conv_ref(x, w, b, group, strides, dilations, begins, outs):
    """Y[n, m, o] = b[m] + sum_{c, k} Xpad[n, g*Cg + c, s*o + d*k] * W[m, c, k]."""
    rank = x.ndim - 2
    kernel = w.shape[2:]
    ends = [
        max(0, (o - 1) * s + d * (k - 1) + 1 - n - p)
        for o, s, d, k, n, p in zip(
            outs, strides, dilations, kernel, x.shape[2:], begins, strict=True
        )
    ]
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *zip(begins, ends, strict=True)])
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    wg = w.astype(np.float64).reshape(group, mg, cg, *kernel)
    y = np.zeros((n, group, mg, *outs))
    for taps in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, s, d, o in zip(taps, strides, dilations, outs, strict=True)
        )
        xs = xp[(slice(None), slice(None), *window)].reshape(n, group, cg, *outs)
        y += np.einsum("ngc...,gmc->ngm...", xs, wg[(..., *taps)])
    y = y.reshape(n, m, *outs)
    if b is not None:
        y += b.astype(np.float64).reshape(m, *([1] * rank))
    return y


def conv_transpose_ref(x, w, b, group, strides, dilations, begins, outs, output_padding):
    """Scatter each input into the full output, then crop [begin, begin + out)."""
    n, c = x.shape[:2]
    mg, kernel = w.shape[1], w.shape[2:]
    cg = c // group
    full = [
        s * (i - 1) + d * (k - 1) + 1 + op
        for s, i, d, k, op in zip(
            strides, x.shape[2:], dilations, kernel, output_padding, strict=True
        )
    ]
    size = [max(f, p + o) for f, p, o in zip(full, begins, outs, strict=True)]
    y = np.zeros((n, group, mg, *size))
    xg = x.astype(np.float64).reshape(n, group, cg, *x.shape[2:])
    wg = w.astype(np.float64).reshape(group, cg, mg, *kernel)
    for pos in itertools.product(*(range(i) for i in x.shape[2:])):
        for taps in itertools.product(*(range(k) for k in kernel)):
            at = tuple(
                s * i + d * t for s, i, d, t in zip(strides, pos, dilations, taps, strict=True)
            )
            y[(slice(None), slice(None), slice(None), *at)] += np.einsum(
                "ngc,gcm->ngm", xg[(..., *pos)], wg[(..., *taps)]
            )
    y = y.reshape(n, group * mg, *size)
    y = y[(slice(None), slice(None), *(slice(p, p + o) for p, o in zip(begins, outs, strict=True)))]
    if b is not None:
        y = y + b.astype(np.float64).reshape(-1, *([1] * len(outs)))
    return y


# ---- Conv ------------------------------------------------------------------------------------


@st.composite
def conv_cases(draw, max_rank=3):
    rank = draw(st.integers(1, max_rank))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.sampled_from([1, 2, 3]))
    mg = draw(st.sampled_from([1, 2, 5]))
    depthwise = draw(st.booleans()) and group > 1
    if depthwise:
        cg = 1
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.integers(1, 2)) for _ in range(rank)]
    mode = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    big = {1: 17, 2: 9, 3: 5}[rank]
    spatial = []
    for k, d in zip(kernel, dilations, strict=True):
        spatial.append(draw(st.integers(d * (k - 1) + 1, big)))
    pads = [draw(st.integers(0, k - 1)) for _ in range(2) for k in kernel]
    return rank, group, cg, mg, kernel, strides, dilations, mode, spatial, pads


def _geometry(spatial, kernel, strides, dilations, mode, pads):
    rank = len(spatial)
    begins, outs = [], []
    for r in range(rank):
        size, k, s, d = spatial[r], kernel[r], strides[r], dilations[r]
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            begin, _, out = same_pads(size, k, s, d, mode)
        elif mode == "VALID":
            begin, out = 0, out_size(size, k, s, d, 0, 0)
        else:
            begin, out = pads[r], out_size(size, k, s, d, pads[r], pads[rank + r])
        begins.append(begin)
        outs.append(out)
    return begins, outs


@fast(40)
@given(case=conv_cases(), bias=st.booleans(), batch=st.sampled_from([1, 2]), seed=seeds)
def test_conv(case, bias, batch, seed):
    _, group, cg, mg, kernel, strides, dilations, mode, spatial, pads = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, (batch, group * cg, *spatial), np.float32, -1, 1)
    w = random_array(rng, (group * mg, cg, *kernel), np.float32, -1, 1)
    b = random_array(rng, (group * mg,), np.float32, -1, 1) if bias else None
    begins, outs = _geometry(spatial, kernel, strides, dilations, mode, pads)
    want = conv_ref(x, w, b, group, strides, dilations, begins, outs).astype(np.float32)
    attrs = {"group": group, "strides": strides, "dilations": dilations, "auto_pad": mode}
    if mode == "NOTSET":
        attrs["pads"] = pads
    args = [x, const(w)] + ([const(b)] if bias else [])
    check_node("Conv", args, want, tol=sum_tol(cg * int(np.prod(kernel))), **attrs)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        # the ResNet stem and body shapes, scaled down; weights as inputs, not initializers
        ((1, 3, 17, 17), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
        ((2, 16, 9, 9), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((1, 16, 9, 9), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}),  # depthwise
        ((1, 4, 13, 13), (6, 4, 1, 1), {"strides": [2, 2]}),  # 1x1 downsample
        ((1, 2, 5, 7), (3, 2, 2, 4), {"pads": [0, 3, 2, 1], "kernel_shape": [2, 4]}),
        ((1, 2, 33), (3, 2, 5), {"pads": [4, 4], "dilations": [3], "strides": [2]}),
        ((1, 1, 1, 1), (1, 1, 1, 1), {}),
    ],
)
def test_conv_forms(x_shape, w_shape, attrs):
    rng = np.random.default_rng(7)
    x = random_array(rng, x_shape, np.float32, -1, 1)
    w = random_array(rng, w_shape, np.float32, -1, 1)
    rank = len(x_shape) - 2
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    pads = attrs.get("pads", [0] * 2 * rank)
    begins, outs = _geometry(x_shape[2:], w_shape[2:], strides, dilations, "NOTSET", pads)
    want = conv_ref(x, w, None, attrs.get("group", 1), strides, dilations, begins, outs)
    tol = sum_tol(int(np.prod(w_shape[1:])))
    check_node("Conv", [x, w], want.astype(np.float32), tol=tol, **attrs)


@pytest.mark.parametrize("opset", [7, 11, 22])
def test_conv_opsets(opset):
    rng = np.random.default_rng(opset)
    x = random_array(rng, (1, 2, 6, 5), np.float32, -1, 1)
    w = random_array(rng, (4, 2, 3, 2), np.float32, -1, 1)
    b = random_array(rng, (4,), np.float32, -1, 1)
    want = conv_ref(x, w, b, 1, [1, 2], [1, 1], [1, 0], [6, 2]).astype(np.float32)
    check_node("Conv", [x, w, b], want, opset=opset, pads=[1, 0, 1, 0], strides=[1, 2])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_dtypes(dtype):
    """float16 accumulates in float32 and rounds once, so it stays close to float64."""
    rng = np.random.default_rng(3)
    x = random_array(rng, (1, 8, 7, 7), dtype, -1, 1)
    w = random_array(rng, (4, 8, 3, 3), dtype, -1, 1)
    want = conv_ref(x, w, None, 1, [1, 1], [1, 1], [1, 1], [7, 7])
    tol = {"rtol": 2e-3, "atol": 2e-3} if dtype == np.float16 else {"rtol": 1e-12, "atol": 1e-12}
    check_node("Conv", [x, w], want.astype(dtype), tol=tol, pads=[1, 1, 1, 1])


def test_padding_is_a_domain_constraint_not_a_copy():
    """Conv is one kernel of two statements (init, reduction) over x, w, y only: the
    padded taps are simply outside the reduction's domain."""
    x = np.zeros((1, 2, 5, 5), np.float32)
    model, _ = node_model(
        "Conv", [x, const(np.ones((3, 2, 3, 3), np.float32))], [(np.float32, 4)], pads=[1] * 4
    )
    program = lower(load_graph(model))
    (kernel,) = program.kernels
    init, update = kernel.statements
    assert update.reduce == "add" and init.reduce is None
    assert "0 <= o0 + k0 - 1 < 5" in update.domain
    assert set(kernel.buffers()) == {"x0", "x1", "y0"}


@fast(25)
@given(
    rank=st.integers(1, 3),
    group=st.sampled_from([1, 2]),
    batch=st.sampled_from([1, 2]),
    data=st.data(),
    seed=seeds,
)
def test_strided_1x1_conv_reads_a_subsampled_copy(rank, group, batch, data, seed):
    """A strided 1x1 Conv without padding copies the positions it reads, then runs as a
    stride-1 1x1 Conv (the GEMM's B one run a channel): odd and prime sizes, strides
    that do not divide them, per-axis strides with one of 1, groups and batches."""
    strides = data.draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    if max(strides) == 1:
        strides[0] = 2
    big = {1: 41, 2: 19, 3: 7}[rank]
    spatial = data.draw(st.lists(st.integers(1, big), min_size=rank, max_size=rank))
    cg, mg = data.draw(st.sampled_from([1, 3, 17])), data.draw(st.sampled_from([1, 5, 23]))
    rng = np.random.default_rng(seed)
    x = random_array(rng, (batch, group * cg, *spatial), np.float32, -1, 1)
    w = random_array(rng, (group * mg, cg, *[1] * rank), np.float32, -1, 1)
    b = random_array(rng, (group * mg,), np.float32, -1, 1)
    outs = [(size - 1) // st_ + 1 for size, st_ in zip(spatial, strides, strict=True)]
    want = conv_ref(x, w, b, group, strides, [1] * rank, [0] * rank, outs).astype(np.float32)
    check_node("Conv", [x, const(w), const(b)], want, tol=sum_tol(cg), group=group, strides=strides)


def test_strided_1x1_conv_copies_only_what_it_reads():
    """The copy is the output's size, read at the stride; the contraction reads it whole."""
    x = np.zeros((1, 16, 13, 11), np.float32)
    w = const(np.ones((8, 16, 1, 1), np.float32))
    model, _ = node_model("Conv", [x, w], [(np.float32, 4)], strides=[2, 3])
    program = lower(load_graph(model))
    (kernel,) = program.kernels
    copy, _, update = kernel.statements
    (temp,) = [name for name in kernel.buffers() if ".subsampled" in name]
    assert program.buffers[temp].shape == (1, 16, 7, 4)
    assert copy.write.buffer == temp
    assert "-> [pn, pc, 2*i0, 3*i1]" in copy.expr.access.index
    assert update.expr.a.access.buffer == temp
    assert "-> [n, c, o0 + k0, o1 + k1]" in update.expr.a.access.index


# ---- ConvInteger ---------------------------------------------------------------------------


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("zero_points", ["none", "scalar", "per_channel"])
def test_conv_integer(x_dtype, zero_points):
    rng = np.random.default_rng(5)
    lo, hi = (0, 255) if x_dtype == np.uint8 else (-128, 127)
    x = random_array(rng, (1, 3, 6, 7), x_dtype, lo, hi)
    w = random_array(rng, (4, 3, 3, 3), np.uint8, 0, 255)
    xz = np.array(rng.integers(lo, hi), x_dtype)
    wz = np.array(rng.integers(0, 255, size=4 if zero_points == "per_channel" else ()), np.uint8)
    xc, wc = x.astype(np.int64), w.astype(np.int64)
    args = [x, w]
    if zero_points != "none":
        xc = xc - int(xz)
        wc = wc - wz.astype(np.int64).reshape(-1, 1, 1, 1)
        args += [xz, wz]
    # a padded tap reads the zero point: it contributes nothing
    want = conv_ref(xc, wc, None, 1, [2, 1], [1, 1], [1, 1], [3, 7]).round().astype(np.int32)
    check_node("ConvInteger", args, want, opset=10, pads=[1, 1, 1, 1], strides=[2, 1])


# ---- ConvTranspose -------------------------------------------------------------------------


@st.composite
def conv_transpose_cases(draw):
    rank = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 1, 2]))
    cg, mg = draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 2]))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.integers(1, 2)) for _ in range(rank)]
    spatial = [draw(st.integers(1, {1: 9, 2: 5, 3: 3}[rank])) for _ in range(rank)]
    extra = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(strides, dilations, strict=True)]
    form = draw(st.sampled_from(["pads", "pads", "output_shape", "SAME_UPPER", "SAME_LOWER"]))
    full = [
        s * (i - 1) + d * (k - 1) + 1 + e
        for s, i, d, k, e in zip(strides, spatial, dilations, kernel, extra, strict=True)
    ]
    if form == "pads":
        pads = [draw(st.integers(0, k - 1)) for _ in range(2) for k in kernel]
        pads = [min(p, (f - 1) // 2) for p, f in zip(pads, full + full, strict=True)]
        begins = pads[:rank]
        outs = [f - pads[r] - pads[rank + r] for r, f in enumerate(full)]
        attrs = {"pads": pads}
    else:
        if form == "output_shape":
            outs = [draw(st.integers(max(1, f - 3), f)) for f in full]
            attrs = {"output_shape": outs}
        else:
            outs = [i * s for i, s in zip(spatial, strides, strict=True)]
            attrs = {"auto_pad": form}
        totals = [max(0, f - o) for f, o in zip(full, outs, strict=True)]
        if form != "output_shape":  # SAME gives min(full, input * stride)
            outs = [f - t for f, t in zip(full, totals, strict=True)]
        begins = [t // 2 if form == "SAME_UPPER" else t - t // 2 for t in totals]
    attrs |= {"strides": strides, "dilations": dilations, "output_padding": extra}
    attrs["group"] = group
    return group, cg, mg, kernel, spatial, begins, outs, attrs


@fast(30)
@given(case=conv_transpose_cases(), bias=st.booleans(), seed=seeds)
def test_conv_transpose(case, bias, seed):
    group, cg, mg, kernel, spatial, begins, outs, attrs = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, (1, group * cg, *spatial), np.float32, -1, 1)
    w = random_array(rng, (group * cg, mg, *kernel), np.float32, -1, 1)
    b = random_array(rng, (group * mg,), np.float32, -1, 1) if bias else None
    want = conv_transpose_ref(
        x, w, b, group, attrs["strides"], attrs["dilations"], begins, outs,
        attrs["output_padding"],
    )  # fmt: skip
    args = [x, const(w)] + ([b] if bias else [])
    tol = sum_tol(cg * int(np.prod(kernel)))
    check_node("ConvTranspose", args, want.astype(np.float32), tol=tol, **attrs)


def test_conv_transpose_upsampling_forms():
    """A stride-2 2x2 decoder upsample, and a stride-2 3x3 one with pads and
    output_padding (the U-Net and GAN shapes), opset 11."""
    rng = np.random.default_rng(11)
    x = random_array(rng, (2, 4, 5, 6), np.float32, -1, 1)
    for kernel, pads, extra in (((2, 2), [0, 0, 0, 0], [0, 0]), ((3, 3), [1, 1, 1, 1], [1, 1])):
        w = random_array(rng, (4, 3, *kernel), np.float32, -1, 1)
        outs = [
            2 * (n - 1) + k - 2 * p + e
            for n, k, p, e in zip((5, 6), kernel, pads[:2], extra, strict=True)
        ]
        want = conv_transpose_ref(x, w, None, 1, [2, 2], [1, 1], pads[:2], outs, extra)
        attrs = {"strides": [2, 2], "pads": pads, "output_padding": extra}
        check_node("ConvTranspose", [x, w], want.astype(np.float32), opset=11, **attrs)


# ---- errors --------------------------------------------------------------------------------


def _lower(op_type, args, rank, **attrs):
    model, _ = node_model(op_type, args, [(np.float32, rank)], **attrs)
    return lower(load_graph(model))


def test_channels_must_match_group():
    x, w = np.zeros((1, 4, 5, 5), np.float32), const(np.zeros((6, 3, 3, 3), np.float32))
    with pytest.raises(
        polyonnx.ModelError,
        match=r"'conv_node'.*weight takes 3 x group 1 channels, the input has 4",
    ):
        _lower("Conv", [x, w], 4)


def test_kernel_shape_must_match_weights():
    x, w = np.zeros((1, 2, 5, 5), np.float32), const(np.zeros((3, 2, 3, 3), np.float32))
    with pytest.raises(
        polyonnx.ModelError,
        match=r"'conv_node'.*'kernel_shape' = \[2, 2\] differs from the weight's \[3, 3\]",
    ):
        _lower("Conv", [x, w], 4, kernel_shape=[2, 2])


def test_window_must_fit():
    x, w = np.zeros((1, 2, 2, 5), np.float32), const(np.zeros((3, 2, 3, 3), np.float32))
    with pytest.raises(polyonnx.LoweringError, match=r"'conv_node'.*does not fit axis 2"):
        _lower("Conv", [x, w], 4)


def test_input_needs_spatial_dims():
    x, w = np.zeros((1, 2), np.float32), const(np.zeros((3, 2), np.float32))
    with pytest.raises(polyonnx.LoweringError, match=r"N x C x D1"):
        _lower("Conv", [x, w], 2)


def test_pads_need_two_entries_per_axis():
    x, w = np.zeros((1, 2, 5, 5), np.float32), const(np.zeros((3, 2, 3, 3), np.float32))
    with pytest.raises(polyonnx.ModelError, match=r"'conv_node'.*'pads' = \[1, 1\] needs 4 values"):
        _lower("Conv", [x, w], 4, pads=[1, 1])


def test_conv_integer_zero_point_shape():
    x = np.zeros((1, 2, 5, 5), np.uint8)
    w = np.zeros((3, 2, 3, 3), np.uint8)
    zp = np.zeros((2,), np.uint8)
    model, _ = node_model("ConvInteger", [x, w, zp], [(np.int32, 4)], opset=10)
    with pytest.raises(polyonnx.LoweringError, match=r"x_zero_point must be a scalar"):
        lower(load_graph(model))
