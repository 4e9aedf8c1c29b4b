"""Whole models: the nine light CNNs of the onnx package (real architectures, generated
weights, batch 1 at 224x224) and examples/*.onnx, polyonnx against onnxruntime at 1 and 2
threads. Compilation (and a first, checked run) happen outside the timed region.

    python -m pytest perf/test_models.py --benchmark-only --benchmark-columns=median,iqr
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.runner import Runner

import polyonnx

pytest.importorskip("onnxruntime")

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = [
    "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
    "shufflenet", "squeezenet", "vgg19", "zfnet512",
]  # fmt: skip
EXAMPLES = sorted(path.stem for path in (ROOT / "examples").glob("*.onnx"))
CASES = [f"light/{name}" for name in LIGHT_MODELS] + [f"examples/{name}" for name in EXAMPLES]
THREADS = [1, 2]


def light_model(name: str) -> tuple[pathlib.Path, dict[str, np.ndarray], np.ndarray]:
    """(path, feed, reference output): the input the onnx test harness generates, as in
    tests/models/test_light_models.py."""
    path = LIGHT / f"light_{name}.onnx"
    model = onnx.load(path)
    weights = {t.name for t in model.graph.initializer}
    data = next(i for i in model.graph.input if i.name not in weights)  # old models list weights
    x = Runner.generate_dummy_data(data, name=name)
    want = numpy_helper.to_array(onnx.load_tensor(LIGHT / f"light_{name}_output_0.pb"))
    return path, {data.name: x}, want


def example_model(name: str, ort_session) -> tuple[pathlib.Path, dict[str, np.ndarray], np.ndarray]:
    """(path, feed, onnxruntime's output): standard-normal inputs, symbolic dims as 1."""
    path = ROOT / "examples" / f"{name}.onnx"
    session = ort_session(path, 1)
    rng = np.random.default_rng(0)
    feed = {
        i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(
            np.float32
        )
        for i in session.get_inputs()
    }
    return path, feed, session.run(None, feed)[0]


@pytest.fixture(scope="module")
def case(request, ort_session):
    """(name, path, feed, reference output) of a case of CASES."""
    kind, name = request.param.split("/")
    made = light_model(name) if kind == "light" else example_model(name, ort_session)
    return (name, *made)


def record(benchmark, name: str, impl: str, threads: int) -> None:
    benchmark.group = f"model-{name}-{threads}t"
    benchmark.extra_info.update(case=f"model-{name}", impl=impl, threads=threads, flops=None)


def ids(value):
    return f"{value}t" if isinstance(value, int) else value.split("/")[1]


@pytest.mark.parametrize("threads", THREADS, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids, indirect=True)
def test_polyonnx(benchmark, ort_session, paired, case, threads):
    name, path, feed, want = case
    session = polyonnx.InferenceSession(str(path), threads=threads)
    (got,) = session.run(None, feed)  # compiled and warm before the timed region
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    record(benchmark, name, "polyonnx", threads)
    benchmark(session.run, None, feed)
    baseline = ort_session(path, threads)
    ours = lambda: session.run(None, feed)  # noqa: E731
    paired(benchmark, ours, {"onnxruntime": lambda: baseline.run(None, feed)}, threads)


@pytest.mark.parametrize("threads", THREADS, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids, indirect=True)
def test_onnxruntime(benchmark, ort_session, case, threads):
    name, path, feed, want = case
    session = ort_session(path, threads)
    (got,) = session.run(None, feed)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    record(benchmark, name, "onnxruntime", threads)
    benchmark(session.run, None, feed)
