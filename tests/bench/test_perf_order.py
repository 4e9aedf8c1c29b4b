"""perf/conftest.py puts the benchmarks of one case side by side (polyonnx and its
baselines seconds apart, not minutes), in their file's order."""

from __future__ import annotations

import importlib.util
import pathlib
from types import SimpleNamespace

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _perf_conftest():
    spec = importlib.util.spec_from_file_location("perf_conftest", ROOT / "perf" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(path: str, test: str, case: str | None):
    callspec = SimpleNamespace(id=case) if case else None
    return SimpleNamespace(
        path=pathlib.Path(path), nodeid=f"{path}::{test}[{case}]", callspec=callspec
    )


def test_each_case_runs_its_baselines_next_to_it():
    kernels, models = "perf/test_kernels.py", "perf/test_models.py"
    items = [
        _item(kernels, "test_polyonnx", "matmul-64-1t"),
        _item(kernels, "test_polyonnx", "matmul-64-2t"),
        _item(kernels, "test_onnxruntime", "matmul-64-1t"),
        _item(kernels, "test_onnxruntime", "matmul-64-2t"),
        _item(kernels, "test_numpy", "matmul-64-1t"),
        _item(models, "test_polyonnx", "resnet50-1t"),
        _item(models, "test_onnxruntime", "resnet50-1t"),
        _item("perf/test_mlp.py", "test_polyonnx", None),
    ]
    order = [(i.path.name, i.nodeid.split("::")[1]) for i in _perf_conftest().side_by_side(items)]
    assert order == [
        ("test_kernels.py", "test_polyonnx[matmul-64-1t]"),
        ("test_kernels.py", "test_onnxruntime[matmul-64-1t]"),
        ("test_kernels.py", "test_numpy[matmul-64-1t]"),
        ("test_kernels.py", "test_polyonnx[matmul-64-2t]"),
        ("test_kernels.py", "test_onnxruntime[matmul-64-2t]"),
        ("test_models.py", "test_polyonnx[resnet50-1t]"),
        ("test_models.py", "test_onnxruntime[resnet50-1t]"),
        ("test_mlp.py", "test_polyonnx[None]"),
    ]
