"""A model batched along a symbolic dim compiles once, for one sample, and runs every batch
size in blocks (runtime/blocks.py): sequences of sizes through one session, each result
checked against onnxruntime, one compile in all."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.errors import InputError
from polyonnx.runtime.blocks import Blocked
from tests.helpers import (
    assert_matches,
    fast,
    make_model,
    reshaped_by_its_shape,
    sum_tol,
    value_info,
)

TORCH = Path(__file__).parent.parent / "data" / "torch"
SIZES = st.lists(st.sampled_from((1, 2, 3, 4, 5, 6, 7, 8, 9, 13)), min_size=2, max_size=5)
"""Batch sizes run one after the other through one session."""

F = np.float32
RNG = np.random.default_rng(0)


def weights(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(F)


def node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


@dataclass(frozen=True)
class Case:
    """A model with a batch dim "N" and how to make its inputs for n samples."""

    model: onnx.ModelProto
    inputs: dict[str, tuple[tuple, type]]
    """Input name -> (shape with "N" for the batch, dtype)."""
    tol: dict

    def feed(self, n: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        feed = {}
        for name, (shape, dtype) in self.inputs.items():
            dims = tuple(n if d == "N" else d for d in shape)
            if dtype == np.bool_:
                feed[name] = rng.random(dims) < 0.5
            elif dtype == np.int64:
                feed[name] = rng.integers(0, 11, dims).astype(np.int64)
            else:
                feed[name] = rng.uniform(-2, 2, dims).astype(dtype)
        return feed


def case(nodes, inputs, outputs, constants=None, opset=18, tol=None) -> Case:
    """``inputs``/``outputs``: name -> (shape, dtype)."""
    model = make_model(
        nodes,
        [value_info(n, t, s) for n, (s, t) in inputs.items()],
        [value_info(n, t, s) for n, (s, t) in outputs.items()],
        constants,
        opset,
    )
    return Case(model, inputs, tol or sum_tol(64))


def broadcasting() -> Case:
    """Add of [N,3,5] with [5] and [1,3,1], Where on a batched condition, Mul."""
    return case(
        [
            node("Add", ["x", "b5"], ["s"]),
            node("Add", ["s", "c"], ["t"]),
            node("Where", ["cond", "t", "x"], ["w"]),
            node("Mul", ["w", "x"], ["y"]),
        ],
        {"x": (("N", 3, 5), F), "c": ((1, 3, 1), F), "cond": (("N", 3, 5), np.bool_)},
        {"y": (("N", 3, 5), F)},
        {"b5": weights(5)},
    )


def matmul() -> Case:
    return case(
        [node("MatMul", ["x", "w"], ["y"])],
        {"x": (("N", 4, 6), F)},
        {"y": (("N", 4, 5), F)},
        {"w": weights(6, 5)},
    )


def batched_matmul() -> Case:
    return case(
        [node("MatMul", ["a", "b"], ["y"])],
        {"a": (("N", 2, 4, 6), F), "b": (("N", 2, 6, 3), F)},
        {"y": (("N", 2, 4, 3), F)},
    )


def gemm() -> Case:
    return case(
        [node("Gemm", ["x", "w", "bias"], ["y"], transB=1, alpha=0.5)],
        {"x": (("N", 6), F)},
        {"y": (("N", 5), F)},
        {"w": weights(5, 6), "bias": weights(5)},
    )


def cnn() -> Case:
    """Conv + Relu + MaxPool + GlobalAveragePool + Flatten + Gemm on 9 x 9 images."""
    return case(
        [
            node("Conv", ["x", "k", "kb"], ["c"], pads=[1, 1, 1, 1]),
            node("Relu", ["c"], ["r"]),
            node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            node("GlobalAveragePool", ["p"], ["g"]),
            node("Flatten", ["g"], ["f"]),
            node("Gemm", ["f", "w", "bias"], ["y"], transB=1),
        ],
        {"x": (("N", 3, 9, 9), F)},
        {"y": (("N", 2), F)},
        {"k": weights(4, 3, 3, 3), "kb": weights(4), "w": weights(2, 4), "bias": weights(2)},
    )


def average_pool() -> Case:
    return case(
        [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
        {"x": (("N", 2, 7, 7), F)},
        {"y": (("N", 2, 3, 3), F)},
    )


def reductions() -> Case:
    """ReduceMean over axis 2 dropping it, ReduceMax over axis 1 keeping it."""
    return case(
        [
            node("ReduceMean", ["x", "a2"], ["mean"], keepdims=0),
            node("ReduceMax", ["x", "a1"], ["max"], keepdims=1),
        ],
        {"x": (("N", 4, 5), F)},
        {"mean": (("N", 4), F), "max": (("N", 1, 5), F)},
        {"a2": ints(2), "a1": ints(1)},
    )


def normalisations() -> Case:
    return case(
        [
            node("Softmax", ["x"], ["soft"], axis=-1),
            node("LayerNormalization", ["x", "gamma", "beta"], ["norm"], axis=-1),
        ],
        {"x": (("N", 3, 8), F)},
        {"soft": (("N", 3, 8), F), "norm": (("N", 3, 8), F)},
        {"gamma": weights(8), "beta": weights(8)},
    )


def embedding() -> Case:
    return case(
        [node("Gather", ["table", "ids"], ["y"], axis=0)],
        {"ids": (("N", 7), np.int64)},
        {"y": (("N", 7, 4), F)},
        {"table": weights(11, 4)},
    )


def computed_shapes() -> Case:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape (as torch exports), then Slice and
    Concat along a non-batch axis."""
    nodes, constants = reshaped_by_its_shape()
    return case(
        nodes,
        {"x": (("N", 3, 4), F)},
        {"y": (("N", 20), F)},
        constants,
    )


def attention(seq: int = 5, embed: int = 8, heads: int = 2) -> Case:
    """Self-attention on [N, S, E]: Q, K, V, heads, scores, softmax, back to [N, S, E]."""
    hd = embed // heads
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "zero1"], ["n1"], axis=0),
        node("Concat", ["n1", "heads_shape"], ["split"], axis=0),
        node("Concat", ["n1", "merged_shape"], ["merge"], axis=0),
    ]
    for p in "qkv":
        nodes += [
            node("MatMul", ["x", f"w{p}"], [f"{p}0"]),
            node("Reshape", [f"{p}0", "split"], [f"{p}1"]),
        ]
    nodes += [
        node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q", "kt"], ["scores0"]),
        node("Mul", ["scores0", "scale"], ["scores"]),
        node("Softmax", ["scores"], ["probs"], axis=-1),
        node("MatMul", ["probs", "v"], ["ctx"]),
        node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        node("Reshape", ["ctx_t", "merge"], ["y"]),
    ]
    constants = {f"w{p}": weights(embed, embed) for p in "qkv"}
    constants |= {
        "zero1": ints(0),
        "heads_shape": ints(seq, heads, hd),
        "merged_shape": ints(seq, embed),
        "scale": np.array(1 / np.sqrt(hd), F),
    }
    return case(nodes, {"x": (("N", seq, embed), F)}, {"y": (("N", seq, embed), F)}, constants)


def batch_inward() -> Case:
    """Transpose the batch to axis 1 (an output batched there) and back."""
    return case(
        [
            node("Transpose", ["x"], ["inward"], perm=[1, 0, 2]),
            node("Relu", ["inward"], ["r"]),
            node("Transpose", ["r"], ["y"], perm=[1, 0, 2]),
        ],
        {"x": (("N", 3, 4), F)},
        {"inward": ((3, "N", 4), F), "y": (("N", 3, 4), F)},
    )


def torch_model(name: str, inputs: dict) -> Callable[[], Case]:
    def make() -> Case:
        model = onnx.load(str(TORCH / f"{name}.onnx"))
        return Case(model, inputs, {"rtol": 1e-4, "atol": 1e-4})

    return make


CASES: dict[str, Callable[[], Case]] = {
    "broadcasting": broadcasting,
    "matmul": matmul,
    "batched_matmul": batched_matmul,
    "gemm": gemm,
    "cnn": cnn,
    "average_pool": average_pool,
    "reductions": reductions,
    "normalisations": normalisations,
    "embedding": embedding,
    "computed_shapes": computed_shapes,
    "attention": attention,
    "batch_inward": batch_inward,
}
TORCH_CASES: dict[str, Callable[[], Case]] = {
    "encoder": torch_model(
        "encoder_torchscript", {"x": (("N", 10, 32), F), "mask": (("N", 10), np.bool_)}
    ),
    "resnet": torch_model("resnet_torchscript", {"x": (("N", 3, 32, 32), F)}),
}


class Harness:
    """A case with one polyonnx session and one onnxruntime session, shared by every
    example of the case (so that the one compile is the session's first)."""

    def __init__(self, case: Case, threads: int = 1):
        self.case = case
        self.session = polyonnx.InferenceSession(case.model, threads=threads, cache=False)
        self.reference = onnxruntime.InferenceSession(
            case.model.SerializeToString(), providers=["CPUExecutionProvider"]
        )

    def check(self, n: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Run ``n`` samples through both sessions; assert they agree."""
        feed = self.case.feed(n, seed)
        got = self.session.run(None, feed)
        want = self.reference.run(None, feed)
        names = [o.name for o in self.reference.get_outputs()]
        for name, actual, expected in zip(names, got, want, strict=True):
            try:
                assert_matches(actual, expected, self.case.tol)
            except AssertionError as exc:
                raise AssertionError(f"output {name!r} at batch {n}: {exc}") from None
        return feed

    def check_blocked(self, feed: dict[str, np.ndarray]) -> None:
        runner = self.session.runner_for(feed)
        assert isinstance(runner, Blocked), self.session.not_blocked
        assert self.session.compile_count == 1


_HARNESSES: dict[str, Harness] = {}


def harness(name: str) -> Harness:
    if name not in _HARNESSES:
        _HARNESSES[name] = Harness({**CASES, **TORCH_CASES}[name]())
    return _HARNESSES[name]


@pytest.mark.parametrize("name", list(CASES))
@fast(max_examples=10)
@given(sizes=SIZES, seed=st.integers(0, 2**16))
def test_batch_sizes_run_in_blocks(name, sizes, seed):
    """Every size of a sequence matches onnxruntime; the session compiled once in all."""
    run = harness(name)
    for n in sizes:
        feed = run.check(n, seed)
    run.check_blocked(feed)


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_torch_exports_run_in_blocks(name):
    """The torch exports' batch is a batch: one compile for sizes 1, 3, 2, 1, 5."""
    run = harness(name)
    for n in (1, 3, 2, 1, 5):
        feed = run.check(n, seed=n)
    run.check_blocked(feed)


def test_one_sample_first_and_later():
    """Size 1 is a block of its own: first, between others, and last."""
    run = Harness(cnn())
    for n in (1, 4, 1, 7, 1):
        feed = run.check(n, seed=n)
    run.check_blocked(feed)


def test_output_batched_along_axis_one():
    """An output whose batch is axis 1 gets every sample's rows at its place there."""
    run = Harness(batch_inward())
    feed = run.check(5, seed=3)
    (inward, _) = run.session.run(None, feed)
    np.testing.assert_array_equal(inward, feed["x"].transpose(1, 0, 2))
    assert run.session.runner_for(feed).plan.outputs["inward"].axis == 1
    run.check_blocked(feed)


def test_inconsistent_batch_names_both_inputs():
    """Two batched inputs of different sizes: InputError naming both, nothing run."""
    run = Harness(batched_matmul())
    run.check(2)
    feed = run.case.feed(3, 0) | {"b": run.case.feed(4, 0)["b"]}
    with pytest.raises(InputError, match=r"'b'.*'N'.*'a'.* 3.* 4"):
        run.session.run(None, feed)
    run.check(4)
    assert run.session.compile_count == 1


def test_empty_batch_falls_back_to_a_specialisation():
    """No sample, no block: batch 0 compiles its own code; blocks still run after."""
    run = Harness(broadcasting())
    run.check(3)
    run.check(0)
    assert run.session.compile_count == 2
    feed = run.check(6)
    assert isinstance(run.session.runner_for(feed), Blocked)
    assert run.session.compile_count == 2
