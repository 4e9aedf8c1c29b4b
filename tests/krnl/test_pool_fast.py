"""The fast pool paths against a float64 numpy reference: the unrolled interior statement
(krnl/ops/pool.py), strided vector loads and masked vector tails (emit/codegen.py), and the
NaN-propagating max (emit/ops.py), over odd sizes, strides 1..3, pads, ceil_mode and
dilations."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import run_node


def _reference(x, op, kernel, strides, pads, dilations, ceil_mode, include_pad=False):
    """Pool ``x`` (N, C, H, W) in float64: padding is NaN, ignored by the nan-reductions."""
    rank = len(kernel)
    spatial = x.shape[2:]
    outs = []
    for i in range(rank):
        span = dilations[i] * (kernel[i] - 1) + 1
        room = spatial[i] + pads[i] + pads[i + rank] - span
        out = (-(-room // strides[i]) if ceil_mode else room // strides[i]) + 1
        if ceil_mode and (out - 1) * strides[i] >= spatial[i] + pads[i]:
            out -= 1
        outs.append(out)
    big = [
        spatial[i] + pads[i] + pads[i + rank] + strides[i] * kernel[i] * dilations[i]
        for i in range(rank)
    ]
    padded = np.full((*x.shape[:2], *big), np.nan)
    padded[:, :, pads[0] : pads[0] + spatial[0], pads[1] : pads[1] + spatial[1]] = x
    counted = np.zeros(big, bool)
    end = [pads[i] + spatial[i] + (pads[i + rank] if include_pad else 0) for i in range(rank)]
    start = [0 if include_pad else pads[i] for i in range(rank)]
    counted[start[0] : end[0], start[1] : end[1]] = True
    y = np.empty((*x.shape[:2], *outs))
    for o0 in range(outs[0]):
        for o1 in range(outs[1]):
            r = [o0 * strides[0] + dilations[0] * k for k in range(kernel[0])]
            c = [o1 * strides[1] + dilations[1] * k for k in range(kernel[1])]
            win = padded[:, :, r][:, :, :, c].reshape(*x.shape[:2], -1)
            if op == "MaxPool":
                # padding is NaN here, so fmax skips it; a window wholly in the padding
                # (possible with dilation) gives -inf, max's identity. onnxruntime gives
                # -FLT_MAX there and the onnx reference 0: the spec leaves it open.
                y[:, :, o0, o1] = np.fmax.reduce(win, -1, initial=-np.inf)
            else:
                n = counted[np.ix_(r, c)].sum()
                y[:, :, o0, o1] = np.nansum(win, -1) / n
    return y


pools = st.fixed_dictionaries(
    {
        "h": st.sampled_from([1, 2, 3, 5, 7, 13, 17, 31]),
        "w": st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 29, 33, 47]),
        "k": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "s": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "d": st.sampled_from([(1, 1), (1, 2), (2, 1)]),
        "p": st.tuples(*(st.integers(0, 1) for _ in range(4))),
        "ceil": st.booleans(),
        "channels": st.sampled_from([1, 3]),
        "seed": st.integers(0, 2**16),
    }
)


def _case(g):
    kernel, strides, dilations = list(g["k"]), list(g["s"]), list(g["d"])
    pads = [min(p, k - 1) for p, k in zip(g["p"], kernel + kernel, strict=True)]
    spans = [d * (k - 1) + 1 for d, k in zip(dilations, kernel, strict=True)]
    if any(n + pads[i] + pads[i + 2] < spans[i] for i, n in enumerate((g["h"], g["w"]))):
        return None
    x = np.random.default_rng(g["seed"]).standard_normal((1, g["channels"], g["h"], g["w"]))
    return x.astype(np.float32), kernel, strides, pads, dilations, int(g["ceil"])


@settings(max_examples=40, deadline=None)
@given(pools)
def test_max_pool_fast_paths(g):
    case = _case(g)
    if case is None:
        return
    x, kernel, strides, pads, dilations, ceil = case
    want = _reference(x.astype(np.float64), "MaxPool", kernel, strides, pads, dilations, ceil)
    (got,) = run_node(
        "MaxPool", [x], [want.astype(np.float32)], kernel_shape=kernel, strides=strides,
        pads=pads, dilations=dilations, ceil_mode=ceil,
    )  # fmt: skip
    np.testing.assert_array_equal(got, want.astype(np.float32))


@settings(max_examples=40, deadline=None)
@given(pools, st.booleans())
def test_average_pool_fast_paths(g, include_pad):
    case = _case(g)
    if case is None:
        return
    x, kernel, strides, pads, _, ceil = case
    ones = [1, 1]
    want = _reference(
        x.astype(np.float64), "AveragePool", kernel, strides, pads, ones, ceil, include_pad
    )
    (got,) = run_node(
        "AveragePool", [x], [want.astype(np.float32)], kernel_shape=kernel, strides=strides,
        pads=pads, ceil_mode=ceil, count_include_pad=int(include_pad),
    )  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_strided_max_pool_propagates_nan_from_any_tap():
    """A NaN in any tap of a stride-2 window (unrolled interior, strided vector loads, the
    masked tail) makes that output NaN; the others are untouched."""
    x = np.random.default_rng(0).standard_normal((1, 2, 9, 37)).astype(np.float32)
    x[0, 0, 4, 20] = np.nan
    x[0, 1, 8, 36] = np.nan
    want = _reference(x.astype(np.float64), "MaxPool", [3, 3], [2, 2], [0] * 4, [1, 1], 0)
    want[0, 0, 1:3, 9:11] = np.nan
    want[0, 1, 3, 17] = np.nan
    (got,) = run_node(
        "MaxPool", [x], [want.astype(np.float32)], kernel_shape=[3, 3], strides=[2, 2]
    )
    np.testing.assert_array_equal(got, want.astype(np.float32))
