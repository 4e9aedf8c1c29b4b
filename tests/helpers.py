"""Shared test helpers: build small ONNX models, run them through polyonnx, compare with a
reference, and hypothesis strategies for shapes, broadcasts and axes.

A test says what the node is, what its inputs are and what numpy says the answer is::

    check_node("Add", [a, b], a + b)
    check_node("ReduceSum", [x, const(np.array([1]))], x.sum(1), keepdims=0, opset=18)

Plain arrays become graph inputs (so the lowering is exercised, not constant folding),
``const(...)`` becomes an initializer (for inputs a lowering needs at compile time: axes,
shapes, …) and ``None`` is an absent optional input.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import polyonnx

OPSET = 17
"""The default-domain opset of test models, unless a test needs another one."""

DIMS = (1, 2, 3, 5, 7, 13, 16, 17, 31, 33)
"""1, primes, non-multiples and exact multiples of the 16-lane vector width."""

MAX_SIZE = 40_000
"""Drawn shapes are capped at this many elements (dims are set to 1 until they fit)."""

FLOAT_TOL = {"rtol": 1e-5, "atol": 1e-6}
"""float32 arithmetic (add, mul, sums): a few ulps, plus reassociation in reductions."""

MATH_TOL = {"rtol": 2e-5, "atol": 2e-6}
"""Transcendentals (exp, log, tanh, erf, …) are polynomial approximations of a few ulps."""


def sum_tol(n: int) -> dict[str, float]:
    """Sums of ``n`` float32 terms of magnitude <= ~1 (contractions, reductions): the
    order of summation differs from numpy's, so allow ~n rounding errors absolute."""
    return {"rtol": 1e-5, "atol": 1e-6 * max(n, 1)}


EXAMPLES_SCALE = float(os.environ.get("POLYONNX_TEST_EXAMPLES_SCALE", "1"))
"""Multiplies every test's hypothesis example count: set it (say to 10) for a deeper,
slower search than the quick default."""


def fast(max_examples: int = 15):
    """hypothesis settings for tests that JIT-compile a model per example (scaled by
    :data:`EXAMPLES_SCALE`)."""
    return settings(
        max_examples=max(1, round(max_examples * EXAMPLES_SCALE)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---- models -----------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    """An input given to the model as an initializer (a compile-time constant)."""

    value: np.ndarray


def const(value) -> Const:
    return Const(np.asarray(value))


def value_info(name: str, dtype, shape: Sequence[int | str | None]) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, list(shape))


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    constants: Mapping[str, np.ndarray] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """A model at IR version 10 importing default-domain ``opset``."""
    initializers = [numpy_helper.from_array(np.asarray(v), k) for k, v in (constants or {}).items()]
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), initializers)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])


def square_conv_model(c: int, m: int, hw: int, k: int, stride: int = 1, pad: int = 1):
    """A one-Conv model ("conv", no bias): c -> m channels of hw x hw, a k x k window of
    ones, square stride and pads."""
    out = (hw + 2 * pad - k) // stride + 1
    w = np.ones((m, c, k, k), np.float32)
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], name="conv", pads=[pad] * 4, strides=[stride] * 2
    )
    x = value_info("x", np.float32, (1, c, hw, hw))
    return make_model([node], [x], [value_info("y", np.float32, (1, m, out, out))], {"w": w})


def node_model(
    op_type: str,
    args: Sequence[np.ndarray | Const | None],
    outputs: Sequence[tuple[np.dtype | type, int]],
    *,
    opset: int = OPSET,
    **attrs,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model and its input feed.

    ``args[i]`` becomes input ``x{i}`` (a graph input, an initializer for a Const, or ''
    for None); ``outputs`` gives each output's dtype and rank (dims are left unknown, so
    the shape comes from shape inference and the lowering, not from the test).
    """
    names, inputs, feed, constants = [], [], {}, {}
    for i, arg in enumerate(args):
        name = f"x{i}"
        if arg is None:
            names.append("")
            continue
        names.append(name)
        if isinstance(arg, Const):
            constants[name] = arg.value
            continue
        arg = np.asarray(arg)
        inputs.append(value_info(name, arg.dtype, arg.shape))
        feed[name] = arg
    out_names = [f"y{i}" for i in range(len(outputs))]
    node = helper.make_node(op_type, names, out_names, name=f"{op_type.lower()}_node", **attrs)
    out_infos = [
        value_info(n, dtype, [None] * rank)
        for n, (dtype, rank) in zip(out_names, outputs, strict=True)
    ]
    return make_model([node], inputs, out_infos, constants, opset), feed


def run_node(
    op_type: str,
    args: Sequence[np.ndarray | Const | None],
    expected: Sequence[np.ndarray],
    *,
    opset: int = OPSET,
    **attrs,
) -> list[np.ndarray]:
    """Run a one-node model whose outputs have the dtypes and ranks of ``expected``."""
    outputs = [(np.asarray(e).dtype, np.ndim(e)) for e in expected]
    model, feed = node_model(op_type, args, outputs, opset=opset, **attrs)
    return polyonnx.InferenceSession(model).run(None, feed)


def check_node(
    op_type: str,
    args: Sequence[np.ndarray | Const | None],
    expected: np.ndarray | Sequence[np.ndarray],
    *,
    tol: Mapping[str, float] = FLOAT_TOL,
    opset: int = OPSET,
    **attrs,
) -> None:
    """Run the node and assert every output matches ``expected`` (one array, or a list
    for several outputs) in dtype, shape and value."""
    wanted = list(expected) if isinstance(expected, list | tuple) else [expected]
    got = run_node(op_type, args, wanted, opset=opset, **attrs)
    assert len(got) == len(wanted)
    for actual, want in zip(got, wanted, strict=True):
        assert_matches(actual, want, tol)


def assert_matches(
    actual: np.ndarray, expected: np.ndarray, tol: Mapping[str, float] = FLOAT_TOL
) -> None:
    """Same dtype and shape; floats within ``tol`` (NaNs and infs must agree), the rest
    exactly."""
    expected = np.asarray(expected)
    assert isinstance(actual, np.ndarray), f"got a {type(actual).__name__}, not an ndarray"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape}, expected {expected.shape}"
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, **tol)
    else:
        np.testing.assert_array_equal(actual, expected)


# ---- data -------------------------------------------------------------------------


def random_array(
    rng: np.random.Generator, shape: Sequence[int], dtype=np.float32, low=-4.0, high=4.0
) -> np.ndarray:
    """Uniform values in [low, high) (integers: [low, high]; bools: fair coin)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return np.asarray(rng.integers(int(low), int(high), size=shape, endpoint=True), dtype)
    return np.asarray(rng.uniform(low, high, size=shape), dtype)


# ---- strategies -------------------------------------------------------------------

seeds = st.integers(0, 2**32 - 1)
dims = st.sampled_from(DIMS)


def cap(shape: Sequence[int], max_size: int = MAX_SIZE) -> tuple[int, ...]:
    """``shape`` with its leading dims set to 1 until it has at most ``max_size`` elements."""
    shape = list(shape)
    for r in range(len(shape)):
        if int(np.prod(shape, dtype=np.int64)) <= max_size:
            break
        shape[r] = 1
    return tuple(shape)


def shapes(min_rank: int = 0, max_rank: int = 4, max_size: int = MAX_SIZE):
    """Shapes of rank ``min_rank..max_rank`` with dims from :data:`DIMS`."""
    return st.lists(dims, min_size=min_rank, max_size=max_rank).map(lambda s: cap(s, max_size))


@st.composite
def broadcast_shapes(draw, n: int = 2, min_rank: int = 0, max_rank: int = 4):
    """``n`` shapes that numpy-broadcast together: suffixes of one shape (so ranks
    differ) with random dims set to 1."""
    out = draw(shapes(min_rank, max_rank))
    result = []
    for _ in range(n):
        rank = draw(st.one_of(st.just(len(out)), st.integers(0, len(out))))
        ones = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        tail = out[len(out) - rank :]
        result.append(tuple(1 if one else d for one, d in zip(ones, tail, strict=True)))
    return result


@st.composite
def axes_of(draw, rank: int, min_size: int = 1):
    """A sorted set of distinct axes of a rank-``rank`` tensor, each randomly given in its
    negative form."""
    chosen = draw(st.sets(st.integers(0, rank - 1), min_size=min_size, max_size=rank))
    return [a - rank if draw(st.booleans()) else a for a in sorted(chosen)]


def axis_of(rank: int):
    """One axis of a rank-``rank`` tensor, in ``[-rank, rank)``."""
    return st.integers(-rank, rank - 1)


def conv2d_reference(x, w, bias, stride: int, pad: int, dilation: int, group: int):
    """Grouped 2-D convolution in float64 numpy (zero padding, square stride, pad and
    dilation), bias optional; float32 result."""
    n, _, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, m, oh, ow), np.float64)
    mg = m // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = xp[
                    :, g * cg : (g + 1) * cg,
                    i * dilation : i * dilation + stride * (oh - 1) + 1 : stride,
                    j * dilation : j * dilation + stride * (ow - 1) + 1 : stride,
                ]  # fmt: skip
                y[:, g * mg : (g + 1) * mg] += np.einsum(
                    "nchw,mc->nmhw", patch, w[g * mg : (g + 1) * mg, :, i, j]
                )
    if bias is not None:
        y += bias[None, :, None, None]
    return y.astype(np.float32)


def reshaped_by_its_shape() -> tuple[list, dict]:
    """Nodes and constants of x [S, 3, 4] reshaped to [S, 12] by a target computed from
    its Shape (Shape -> Gather -> Unsqueeze -> Concat, as torch exports it), then a Slice
    and a Concat along the static axis: y [S, 20]."""
    import onnx.helper

    def node(op, inputs, outputs, **attrs):
        return onnx.helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)

    def ints(*values):
        return np.array(values, np.int64)

    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "zero"], ["n"], axis=0),
        node("Unsqueeze", ["n", "zero1"], ["n1"]),
        node("Concat", ["n1", "minus1"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["flat"]),
        node("Slice", ["flat", "start", "end", "one1"], ["part"]),
        node("Concat", ["part", "flat"], ["y"], axis=1),
    ]
    constants = {
        "zero": np.array(0, np.int64), "zero1": ints(0), "minus1": ints(-1),
        "start": ints(2), "end": ints(10), "one1": ints(1),
    }  # fmt: skip
    return nodes, constants
