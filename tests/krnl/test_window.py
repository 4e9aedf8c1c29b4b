"""Windows, MelWeightMatrix, DFT and STFT (polyonnx/krnl/ops/window.py) against numpy
(np.fft for the transforms) and, for MelWeightMatrix, the ONNX reference.

A window or mel matrix depends only on its (compile-time) scalar inputs, so the frontend
would constant-fold the node with onnx.reference and the lowering would never run; those
tests turn folding off (:func:`unfolded`) to exercise it.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from polyonnx.errors import LoweringError
from polyonnx.frontend import fold
from tests.helpers import check_node, const, fast, node_model, random_array, run_node, seeds

OPSET = 17
DFT_TOL = {"rtol": 1e-5, "atol": 1e-5}
CODES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
         np.float16: TensorProto.FLOAT16, np.int32: TensorProto.INT32}  # fmt: skip


@contextmanager
def unfolded():
    """No constant folding of nodes with outputs: the node reaches its lowering."""
    with mock.patch.object(fold, "MAX_FOLD_ELEMENTS", 0):
        yield


# ---- windows -------------------------------------------------------------------------------


def window(op: str, size: int, periodic: bool) -> np.ndarray:
    n = np.arange(size, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        angle = 2 * np.pi * n / (size if periodic else size - 1)
    if op == "HannWindow":
        return np.sin(angle / 2) ** 2
    if op == "HammingWindow":
        return 25 / 46 - 21 / 46 * np.cos(angle)
    return 0.42 - 0.5 * np.cos(angle) + 0.08 * np.cos(2 * angle)


@fast(25)
@given(
    op=st.sampled_from(["HannWindow", "HammingWindow", "BlackmanWindow"]),
    size=st.sampled_from([2, 3, 7, 16, 17, 100, 1000]),
    periodic=st.sampled_from([None, 0, 1]),
    dtype=st.sampled_from([None, np.float32, np.float64, np.float16]),
    size_dtype=st.sampled_from([np.int32, np.int64]),
)
def test_windows(op, size, periodic, dtype, size_dtype):
    want = window(op, size, periodic in (None, 1)).astype(dtype or np.float32)
    attrs = {} if periodic is None else {"periodic": periodic}
    if dtype is not None:
        attrs["output_datatype"] = CODES[dtype]
    tol = {"rtol": 1e-3, "atol": 1e-3} if dtype == np.float16 else {"rtol": 1e-6, "atol": 1e-6}
    with unfolded():
        check_node(op, [const(np.array(size, size_dtype))], want, tol=tol, opset=OPSET, **attrs)


def test_window_size_one_and_integers():
    """A symmetric window of one sample is 0/0 (NaN), as in the reference; a periodic one
    is the window at angle 0; integer outputs truncate."""
    nan = np.array([np.nan], np.float32)
    blackman = window("BlackmanWindow", 9, True).astype(np.int32)
    with unfolded():
        check_node("HannWindow", [const(np.array(1))], nan, periodic=0, opset=OPSET)
        check_node("HammingWindow", [const(np.array(1))], np.array([4 / 46], np.float32),
                   opset=OPSET)  # fmt: skip
        check_node("BlackmanWindow", [const(np.array(9))], blackman,
                   output_datatype=TensorProto.INT32, opset=OPSET)  # fmt: skip


def test_window_size_as_a_graph_input():
    """The session compiles for the size's value."""
    want = window("HannWindow", 10, True).astype(np.float32)
    with unfolded():
        check_node("HannWindow", [np.array(10, np.int64)], want, opset=OPSET)


# ---- MelWeightMatrix -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bins", "dft", "rate", "low", "high", "dtype"),
    [
        (8, 16, 8192, 0.0, 4096.0, None),
        (20, 512, 16000, 20.0, 8000.0, np.float64),
        (5, 31, 22050, 300.0, 3000.0, np.float32),
        (40, 1024, 44100, 0.0, 22050.0, np.float16),
    ],
)
def test_mel_weight_matrix(bins, dft, rate, low, high, dtype):
    args = [np.array(bins, np.int64), np.array(dft, np.int64), np.array(rate, np.int64),
            np.array(low, np.float32), np.array(high, np.float32)]  # fmt: skip
    attrs = {} if dtype is None else {"output_datatype": CODES[dtype]}
    out = dtype or np.float32
    model, feed = node_model("MelWeightMatrix", args, [(out, 2)], opset=OPSET, **attrs)
    (want,) = ReferenceEvaluator(model).run(None, feed)
    with unfolded():
        check_node("MelWeightMatrix", [const(a) for a in args], want, opset=OPSET, **attrs)


# ---- DFT -------------------------------------------------------------------------------------


def as_pairs(z: np.ndarray, dtype) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def dft(x, n, axis, inverse, onesided) -> np.ndarray:
    signal = x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]
    signal = signal.astype(np.complex128)
    if inverse and onesided:
        return np.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
    if inverse:
        return as_pairs(np.fft.ifft(signal, n=n, axis=axis), x.dtype)
    spectrum = np.fft.fft(signal, n=n, axis=axis)
    if onesided:
        spectrum = np.take(spectrum, np.arange(n // 2 + 1), axis=axis)
    return as_pairs(spectrum, x.dtype)


@fast(40)
@given(
    seed=seeds,
    data=st.data(),
    rank=st.integers(1, 3),
    complex_input=st.booleans(),
    inverse=st.booleans(),
    onesided=st.booleans(),
    opset=st.sampled_from([17, 20]),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_dft_matches_numpy(seed, data, rank, complex_input, inverse, onesided, opset, dtype):
    if onesided and not inverse:
        complex_input = False  # a one-sided forward transform is for real signals
    shape = [data.draw(st.sampled_from([1, 2, 3, 5, 8, 13, 16, 31])) for _ in range(rank)]
    axis = data.draw(st.integers(0, rank - 1))
    length = shape[axis]
    x = random_array(np.random.default_rng(seed), [*shape, 2 if complex_input else 1], dtype)
    given_length = data.draw(st.sampled_from([None, 1, 4, 7, 16]))
    n = given_length or (2 * (length - 1) if inverse and onesided else length)
    if n < 1:
        n = given_length = 1
    want = dft(x, n, axis, inverse, onesided)
    attrs = {"inverse": int(inverse), "onesided": int(onesided)}
    length_arg = None if given_length is None else const(np.array(given_length, np.int64))
    signed_axis = axis - rank - 1 if data.draw(st.booleans()) else axis
    if opset == 20:
        args = [x, length_arg, const(np.array(signed_axis, np.int64))]
        if signed_axis == rank - 1 and data.draw(st.booleans()):
            args = args[:2]  # the default axis, -2
    else:
        args, attrs["axis"] = [x, length_arg], signed_axis
    if args[-1] is None:
        args = args[:-1]
    check_node("DFT", args, want, tol=DFT_TOL, opset=opset, **attrs)


def test_dft_long_signal():
    """A 1000-point transform: the twiddles are exact however large f * t grows."""
    x = random_array(np.random.default_rng(9), (2, 1000, 1), np.float32, -1, 1)
    check_node("DFT", [x], dft(x, 1000, 1, False, False), tol={"rtol": 1e-5, "atol": 2e-5},
               opset=17)  # fmt: skip


def test_dft_float16():
    x = random_array(np.random.default_rng(10), (3, 12, 2), np.float16, -1, 1)
    want = dft(x.astype(np.float64), 12, 1, False, False).astype(np.float16)
    check_node("DFT", [x], want, tol={"rtol": 1e-2, "atol": 1e-2}, opset=17)


def test_dft_refuses_the_complex_axis():
    x = np.zeros((4, 2), np.float32)
    with pytest.raises(LoweringError, match="trailing"):
        run_node("DFT", [x, None, const(np.array(-1, np.int64))], [x], opset=20)


# ---- STFT ------------------------------------------------------------------------------------


def stft(x, step, window_values, n, onesided) -> np.ndarray:
    signal = x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]
    frames = (signal.shape[1] - n) // step + 1
    picked = np.stack([signal[:, f * step : f * step + n] for f in range(frames)], axis=1)
    if window_values is not None:
        picked = picked * window_values
    spectrum = np.fft.fft(picked.astype(np.complex128), axis=-1)
    if onesided:
        spectrum = spectrum[..., : n // 2 + 1]
    return as_pairs(spectrum, x.dtype)


@fast(25)
@given(
    seed=seeds,
    data=st.data(),
    complex_input=st.booleans(),
    onesided=st.sampled_from([None, 0, 1]),
    with_window=st.booleans(),
    with_length=st.booleans(),
)
def test_stft_matches_numpy(seed, data, complex_input, onesided, with_window, with_length):
    if complex_input:
        onesided = 0
    rng = np.random.default_rng(seed)
    length = data.draw(st.sampled_from([8, 17, 64, 100]))
    n = data.draw(st.integers(1, min(length, 32)))
    step = data.draw(st.integers(1, 9))
    x = random_array(rng, (data.draw(st.integers(1, 3)), length, 2 if complex_input else 1),
                     np.float32)  # fmt: skip
    window_values = rng.uniform(0, 1, size=n).astype(np.float32) if with_window else None
    if not with_window and not with_length:
        n = length
    want = stft(x, step, window_values, n, onesided in (None, 1))
    args = [x, const(np.array(step, np.int64)), window_values,
            const(np.array(n, np.int64)) if with_length else None]  # fmt: skip
    while args[-1] is None:
        args.pop()
    attrs = {} if onesided is None else {"onesided": onesided}
    check_node("STFT", args, want, tol=DFT_TOL, opset=OPSET, **attrs)
