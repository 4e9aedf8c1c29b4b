"""torch dynamo exports of tiny transformers models (BERT, GPT-2, LLaMA-style; built from
configs, random weights: tests/data/transformers/export_models.py) load, compile and match
onnxruntime at batch sizes and sequence lengths from one session, padded masks included.
Their padding masks are GatherND over the mask, the op these exports failed on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polyonnx

DATA = Path(__file__).parent.parent / "data" / "transformers"
NAMES = ("bert", "gpt2", "llama")
_SESSIONS: dict[str, tuple] = {}


def sessions(name: str):
    if name not in _SESSIONS:
        path = str(DATA / f"{name}_dynamo.onnx")
        reference = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        _SESSIONS[name] = (polyonnx.InferenceSession(path, cache=False), reference)
    return _SESSIONS[name]


def feed(batch: int, seq: int, padded: list[int], seed: int) -> dict[str, np.ndarray]:
    """Ids and a mask whose rows keep ``padded[b]`` tokens (at least one: a row of padding
    only is all -inf in the softmax, NaN in both engines)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, seq), np.int64)
    for row, keep in enumerate(padded):
        mask[row, : max(1, min(keep, seq))] = 1
    return {"input_ids": rng.integers(0, 100, (batch, seq)), "attention_mask": mask}


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_dynamo_export_matches_onnxruntime(name, data):
    """Shapes of every batch and length (1, primes, past a vector) through one session."""
    ours, reference = sessions(name)
    batch = data.draw(st.sampled_from([1, 2, 3]), label="batch")
    seq = data.draw(st.sampled_from([1, 5, 7, 16, 19]), label="seq")
    padded = data.draw(st.lists(st.integers(1, seq), min_size=batch, max_size=batch))
    inputs = feed(batch, seq, padded, data.draw(st.integers(0, 2**16), label="seed"))
    got = ours.run(None, inputs)[0]
    want = reference.run(None, inputs)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_one_compile_serves_every_length(name):
    """Batches and lengths from 2 on run the one parametric compile (BERT's sliced
    position ids fold another way at length 1, which compiles for its shape)."""
    path = str(DATA / f"{name}_dynamo.onnx")
    ours = polyonnx.InferenceSession(path, cache=False)
    reference = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch, seq in ((2, 7), (1, 5), (3, 16), (2, 33), (1, 2)):
        inputs = feed(batch, seq, [seq - 1] * batch, seed=seq)
        got, want = ours.run(None, inputs)[0], reference.run(None, inputs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert ours.compile_count == 1, ours.not_parametric
