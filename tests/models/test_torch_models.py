"""Models exported from PyTorch (tests/data/torch/export_models.py: TorchScript exporter at
opset 17, dynamo exporter at opset 18, two of them with weights in external data) compile,
run and match onnxruntime on random inputs. torch is needed only to re-export them."""

from __future__ import annotations

import pathlib
import zlib

import numpy as np
import onnx
import pytest

import polyonnx

ort = pytest.importorskip("onnxruntime")

DATA = pathlib.Path(__file__).resolve().parent.parent / "data" / "torch"
MODELS = sorted(DATA.glob("*.onnx"))
OPSETS = {"torchscript": 17, "dynamo": 18}
EXTERNAL = {"resnet", "gpt"}
"""Architectures whose weights are in <name>_<exporter>.data."""
DYNAMIC_DIM = 3
"""Every symbolic dim (batch, seq) is set to this: not the export's example size (2)."""
TOKENS = 64
"""Token ids are drawn below the GPT's vocabulary size."""


def random_input(value: onnx.ValueInfoProto, rng: np.random.Generator) -> np.ndarray:
    """A random array of the input's declared dtype and shape.

    Bool inputs are key-padding masks (True = padding): position 0 of every sequence is
    kept, so no attention row is masked entirely (that row would be NaN everywhere)."""
    tensor = value.type.tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else DYNAMIC_DIM for d in tensor.shape.dim)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
    if dtype == np.bool_:
        mask = rng.random(shape) < 0.3
        mask[..., 0] = False
        return mask
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, TOKENS, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def model_inputs(path: pathlib.Path) -> dict[str, np.ndarray]:
    model = onnx.load(path, load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(zlib.crc32(path.stem.encode()))
    return {v.name: random_input(v, rng) for v in model.graph.input if v.name not in weights}


def test_every_architecture_is_exported_both_ways():
    """Both exporters, but the sequence encoder: dynamo alone keeps its sequence dynamic
    (export_models.py's SeqEncoder)."""
    names = {p.stem for p in MODELS}
    archs = {"mlp", "lenet", "resnet", "mobilenet", "encoder", "gpt", "lstm"}
    assert names == {f"{a}_{e}" for a in archs for e in OPSETS} | {"seqencoder_dynamo"}
    for path in MODELS:
        arch, exporter = path.stem.rsplit("_", 1)
        model = onnx.load(path, load_external_data=False)
        assert {o.domain: o.version for o in model.opset_import}[""] == OPSETS[exporter]
        assert (DATA / f"{path.stem}.data").exists() == (arch in EXTERNAL)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_torch_model_matches_onnxruntime(path):
    feed = model_inputs(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    want = reference.run(None, feed)

    session = polyonnx.InferenceSession(str(path))
    got = session.run(None, feed)

    assert [o.name for o in session.get_outputs()] == [o.name for o in reference.get_outputs()]
    for name, g, w in zip([o.name for o in reference.get_outputs()], got, want, strict=True):
        assert g.shape == w.shape, name
        assert g.dtype == w.dtype, name
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)
