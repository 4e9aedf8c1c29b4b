"""Single-op kernels (float32, opset 17): polyonnx against onnxruntime, and against numpy's
OpenBLAS for MatMul, at 1 and 2 threads.

Shapes are named M x K x N for MatMul. The Conv layers are the distinct shapes of
ResNet-50 at batch 1 (weights and bias as initializers, as after BatchNorm folding) and
one MobileNet depthwise layer. Every benchmark records ``extra_info``: ``case``, ``impl``
(polyonnx, onnxruntime, numpy), ``threads`` and ``flops`` (None for the memory-bound
ops), which ``perf/report.py`` turns into one table of ratios and GFLOP/s.

    python -m pytest perf/test_kernels.py --benchmark-only --benchmark-columns=median,iqr
    POLYONNX_BENCH_FULL=1 python -m pytest perf/test_kernels.py --benchmark-only  # + slow

numpy's OpenBLAS threads are set with threadpoolctl when it is installed, else through
OpenBLAS's own ``*_set_num_threads`` entry; if neither is found, numpy runs with OpenBLAS's
default threads and ``extra_info["blas_threads"]`` says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyonnx
from polyonnx.emit.fmapeak import fma_peak_gflops
from polyonnx.target import host_target

pytest.importorskip("onnxruntime")

FULL = os.environ.get("POLYONNX_BENCH_FULL") == "1"
THREADS = [1, 2]
FLOAT = TensorProto.FLOAT


@dataclass(frozen=True)
class Case:
    """One single-op model: ``build(rng)`` gives the model and its input feed."""

    name: str
    build: Callable[[np.random.Generator], tuple[onnx.ModelProto, dict[str, np.ndarray]]]
    flops: int | None = None
    matmul: bool = False


def float_model(nodes, inputs, output_shape, initializers=()) -> onnx.ModelProto:
    """A float32 model of ``nodes`` whose last output is the model's; ``inputs``: name ->
    array (only its shape is used)."""
    graph = helper.make_graph(
        nodes,
        "_".join(node.op_type for node in nodes),
        [helper.make_tensor_value_info(n, FLOAT, a.shape) for n, a in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], FLOAT, output_shape)],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def matmul(m: int, k: int, n: int, batch: int | None = None, name: str | None = None) -> Case:
    lead = () if batch is None else (batch,)

    def build(rng):
        feed = {"a": normal(rng, *lead, m, k), "b": normal(rng, *lead, k, n)}
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        return float_model([node], feed, [*lead, m, n]), feed

    flops = 2 * (batch or 1) * m * n * k
    return Case(name or f"matmul-{m}x{k}x{n}", build, flops, matmul=True)


def conv(name: str, c_in: int, c_out: int, size: int, kernel: int, stride=1, group=1) -> Case:
    """A square batch-1 Conv with bias, padded to keep ``size / stride``."""
    pad = kernel // 2
    out = (size + 2 * pad - kernel) // stride + 1

    def build(rng):
        fan_in = c_in // group * kernel * kernel
        weights = normal(rng, c_out, c_in // group, kernel, kernel, scale=fan_in**-0.5)
        feed = {"x": normal(rng, 1, c_in, size, size)}
        node = helper.make_node(
            "Conv", ["x", "w", "bias"], ["y"], kernel_shape=[kernel, kernel],
            strides=[stride, stride], pads=[pad] * 4, group=group,
        )  # fmt: skip
        initializers = [("w", weights), ("bias", normal(rng, c_out))]
        return float_model([node], feed, [1, c_out, out, out], initializers), feed

    flops = 2 * c_out * out * out * (c_in // group) * kernel * kernel
    return Case(name, build, flops)


def eltwise_chain(rows: int, cols: int) -> Case:
    """Add (a row vector) -> Mul (a column vector) -> Relu -> Sigmoid: broadcasting."""

    def build(rng):
        feed = {"x": normal(rng, rows, cols), "b": normal(rng, cols), "s": normal(rng, rows, 1)}
        nodes = [
            helper.make_node("Add", ["x", "b"], ["t0"]),
            helper.make_node("Mul", ["t0", "s"], ["t1"]),
            helper.make_node("Relu", ["t1"], ["t2"]),
            helper.make_node("Sigmoid", ["t2"], ["y"]),
        ]
        return float_model(nodes, feed, [rows, cols]), feed

    return Case(f"eltwise-chain-{rows}x{cols}", build)


def softmax(rows: int, cols: int) -> Case:
    def build(rng):
        feed = {"x": normal(rng, rows, cols)}
        node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
        return float_model([node], feed, [rows, cols]), feed

    return Case(f"softmax-{rows}x{cols}", build)


def layernorm(rows: int, cols: int) -> Case:
    def build(rng):
        feed = {"x": normal(rng, rows, cols)}
        node = helper.make_node(
            "LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1, epsilon=1e-5
        )
        initializers = [("scale", normal(rng, cols)), ("bias", normal(rng, cols))]
        return float_model([node], feed, [rows, cols], initializers), feed

    return Case(f"layernorm-{rows}x{cols}", build)


SQUARE = [64, 128, 256, 512, 1024] + ([2048] if FULL else [])
CASES = [
    *(matmul(n, n, n, name=f"matmul-{n}") for n in SQUARE),
    matmul(1000, 1000, 1000),
    matmul(127, 255, 63),
    matmul(1, 4096, 4096),
    *([matmul(4096, 64, 4096)] if FULL else []),
    matmul(128, 64, 128, batch=12, name="attention-12x128x64x128"),
    conv("conv-7x7s2-3to64-224", 3, 64, 224, 7, stride=2),
    conv("conv-1x1-64to256-56", 64, 256, 56, 1),
    conv("conv-3x3-64to64-56", 64, 64, 56, 3),
    conv("conv-1x1-256to64-56", 256, 64, 56, 1),
    conv("conv-3x3s2-128to128-56", 128, 128, 56, 3, stride=2),
    conv("conv-1x1s2-256to512-56", 256, 512, 56, 1, stride=2),
    conv("conv-3x3-256to256-14", 256, 256, 14, 3),
    conv("conv-3x3-512to512-7", 512, 512, 7, 3),
    conv("dwconv-3x3-32-112", 32, 32, 112, 3, group=32),
    eltwise_chain(64, 1024),
    softmax(512, 1024),
    layernorm(512, 768),
]
MATMULS = [case for case in CASES if case.matmul]


def ids(value):
    return f"{value}t" if isinstance(value, int) else value.name


@pytest.fixture(scope="module")
def built(ort_session):
    """``built(case)``: (model, feed, reference output from onnxruntime), made once."""

    @functools.cache
    def build(case: Case):
        model, feed = case.build(np.random.default_rng(0))
        (want,) = ort_session(model, 1).run(None, feed)
        return model, feed, want

    return build


def check(got: np.ndarray, want: np.ndarray) -> None:
    atol = 1e-4 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=atol)


def record(benchmark, case: Case, impl: str, threads: int, **extra) -> None:
    benchmark.group = f"{case.name}-{threads}t"
    benchmark.extra_info.update(case=case.name, impl=impl, threads=threads, flops=case.flops)
    benchmark.extra_info.update(extra)


@pytest.mark.parametrize("threads", THREADS, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_polyonnx(benchmark, built, ort_session, paired, case, threads):
    model, feed, want = built(case)
    session = polyonnx.InferenceSession(model, threads=threads)
    check(session.run(None, feed)[0], want)  # compiled and warm before the timed region
    record(benchmark, case, "polyonnx", threads)
    benchmark(session.run, None, feed)
    if case.flops:  # the clock as it is now: a VM's drifts over a run (bench/cases.py Row)
        benchmark.extra_info["peak_gflops_per_core"] = fma_peak_gflops(host_target(), trials=3)
    baseline = ort_session(model, threads)
    baselines = {"onnxruntime": lambda: baseline.run(None, feed)}
    if case.matmul:
        out = np.empty_like(want)
        baselines["numpy"] = lambda: np.matmul(feed["a"], feed["b"], out=out)
    with blas_threads(threads):
        paired(benchmark, lambda: session.run(None, feed), baselines, threads)


@pytest.mark.parametrize("threads", THREADS, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_onnxruntime(benchmark, built, ort_session, case, threads):
    model, feed, want = built(case)
    session = ort_session(model, threads)
    check(session.run(None, feed)[0], want)
    record(benchmark, case, "onnxruntime", threads)
    benchmark(session.run, None, feed)


@pytest.mark.parametrize("threads", THREADS, ids=ids)
@pytest.mark.parametrize("case", MATMULS, ids=ids)
def test_numpy(benchmark, built, case, threads):
    _, feed, want = built(case)
    a, b = feed["a"], feed["b"]
    out = np.empty_like(want)
    with blas_threads(threads) as how:
        check(np.matmul(a, b, out=out), want)
        record(benchmark, case, "numpy", threads, blas_threads=how)
        benchmark(np.matmul, a, b, out=out)


# -- numpy's BLAS threads ----------------------------------------------------------------


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[str]:
    """Run numpy's BLAS on ``n`` threads; yields how they were set."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(n, user_api="blas"):
            yield "threadpoolctl"
        return
    entries = openblas_entries()
    if entries is None:
        yield "OpenBLAS default"
        return
    get, set_ = entries
    before = get()
    set_(n)
    try:
        yield "openblas_set_num_threads"
    finally:
        set_(before)


@functools.cache
def openblas_entries() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """(get, set) of the thread count of the OpenBLAS numpy loaded, found through
    /proc/self/maps (Linux); None where it cannot be found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for prefix, suffix in [("scipy_openblas", "64_"), ("scipy_openblas", ""),
                               ("openblas", "64_"), ("openblas", "")]:  # fmt: skip
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                return get, set_
    return None
