"""The nine real CNNs that ship in the onnx package ("light" models: real architectures
with generated weights) compile, run and match their reference outputs."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.runner import Runner

import polyonnx

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = [
    "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
    "shufflenet", "squeezenet", "vgg19", "zfnet512",
]  # fmt: skip


def light_model(name: str) -> tuple[pathlib.Path, np.ndarray, np.ndarray]:
    """(model path, the harness's deterministic input, the reference output)."""
    path = LIGHT / f"light_{name}.onnx"
    model = onnx.load(path)
    weights = {t.name for t in model.graph.initializer}
    data = next(i for i in model.graph.input if i.name not in weights)  # old models list weights
    x = Runner.generate_dummy_data(data, name=name)
    want = numpy_helper.to_array(onnx.load_tensor(LIGHT / f"light_{name}_output_0.pb"))
    return path, x, want


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_reference_output(name):
    path, x, want = light_model(name)
    session = polyonnx.InferenceSession(str(path))
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
