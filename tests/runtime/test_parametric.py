"""A model with a symbolic dim that is not a batch (a sequence axis S) compiles once,
with S an isl parameter (runtime/parametric.py): sequences of sizes through one session,
each result checked against onnxruntime, one compile in all. Intermediates start as NaN
bytes (POLYONNX_POISON_ARENA), so a read before a write shows."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from polyonnx.errors import InputError
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import supported_ops
from polyonnx.runtime.blocks import Blocked
from polyonnx.runtime.compiled import POISON
from polyonnx.runtime.parametric import ParametricModel, compile_parametric, graph_at
from polyonnx.runtime.session import InferenceSession
from tests.helpers import assert_matches, fast, make_model, reshaped_by_its_shape, value_info

F = np.float32
RNG = np.random.default_rng(0)
SIZES = st.lists(
    st.sampled_from((1, 2, 3, 5, 7, 9, 13, 17, 31, 64, 100, 127, 130, 300)),
    min_size=2,
    max_size=5,
)
"""Sizes of S run one after the other through one session: 1, primes, sizes that are
not multiples of 8 or 16, and sizes past the largest sample point (127)."""
PARAMETRIC = "parametric"
BLOCKED = "blocked"
SIZE_CONSTANT = r"kernel .* \(\w+\)\.statements\[\d+\]\.expr\..* depends on the sizes"
"""Why a mean over S is not parametric: its 1 / S is a float constant of the kernel."""
FIRST = (1, 130, 7)
"""Run first by every case (hypothesis then adds sequences of its own)."""


def weights(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(F)


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def float_tol(s: int, terms: Callable[[int], int] = lambda s: 1) -> dict[str, float]:
    """float32 tolerance for results that sum ``terms(s)`` products of magnitude <= ~1."""
    return {"rtol": 1e-4, "atol": 1e-5 * max(terms(s), 1)}


@dataclass(frozen=True)
class Case:
    """A model with a symbolic dim "S", how to make its inputs, and what the session
    should do with it (``expect``): PARAMETRIC, BLOCKED (S is a provable batch:
    runtime/blocks.py runs it, and the case's parametric model is compiled directly), or
    a regex of the reason it is not parametric (compiled per shape)."""

    model: onnx.ModelProto
    inputs: dict[str, tuple[tuple, type]]
    tol: Callable[[int], dict] = float_tol
    expect: str = "parametric"
    low: dict[str, int] = field(default_factory=dict)
    """Input name -> the low end of its int64 values (the high end is 11)."""

    def feed(self, s: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        feed = {}
        for name, (shape, dtype) in self.inputs.items():
            dims = tuple(s if d == "S" else d for d in shape)
            if dtype == np.int64:
                feed[name] = rng.integers(self.low.get(name, 0), 11, dims).astype(np.int64)
            else:
                feed[name] = rng.uniform(-1, 1, dims).astype(dtype)
        return feed


def case(nodes, inputs, outputs, constants=None, **kw) -> Case:
    """``inputs``/``outputs``: name -> (shape, dtype); opset 17, IR version 10."""
    model = make_model(
        nodes,
        [value_info(n, t, s) for n, (s, t) in inputs.items()],
        [value_info(n, t, s) for n, (s, t) in outputs.items()],
        constants,
        17,
    )
    return Case(model, inputs, **kw)


def add_broadcast() -> Case:
    """[S, 8] + [8]."""
    return case(
        [node("Add", ["x", "b"], ["y"])],
        {"x": (("S", 8), F)},
        {"y": (("S", 8), F)},
        {"b": weights(8)},
        expect=BLOCKED,
    )


def mul_broadcast() -> Case:
    """[1, S, 8] * [S, 1] (both broadcast: S against S, 8 against 1)."""
    return case(
        [node("Mul", ["a", "c"], ["y"]), node("Sub", ["y", "a"], ["z"])],
        {"a": ((1, "S", 8), F), "c": (("S", 1), F)},
        {"y": ((1, "S", 8), F), "z": ((1, "S", 8), F)},
        expect=BLOCKED,
    )


def matmul_rows() -> Case:
    """[S, 16] x [16, 8]."""
    return case(
        [node("MatMul", ["x", "w"], ["y"])],
        {"x": (("S", 16), F)},
        {"y": (("S", 8), F)},
        {"w": weights(16, 8)},
        tol=lambda s: float_tol(s, lambda s: 16),
        expect=BLOCKED,
    )


def matmul_contraction() -> Case:
    """[4, S] x [S, 6]: S contracted."""
    return case(
        [node("MatMul", ["a", "b"], ["y"])],
        {"a": ((4, "S"), F), "b": (("S", 6), F)},
        {"y": ((4, 6), F)},
        tol=lambda s: float_tol(s, lambda s: s),
    )


def matmul_columns() -> Case:
    """[S, 16] x [16, S]: S as rows and as columns."""
    return case(
        [node("MatMul", ["a", "b"], ["y"])],
        {"a": (("S", 16), F), "b": ((16, "S"), F)},
        {"y": (("S", "S"), F)},
        tol=lambda s: float_tol(s, lambda s: 16),
    )


def gemm() -> Case:
    """Gemm of [S, 16] with a transposed [8, 16], alpha, beta and a bias."""
    return case(
        [node("Gemm", ["x", "w", "bias"], ["y"], transB=1, alpha=0.5, beta=2.0)],
        {"x": (("S", 16), F)},
        {"y": (("S", 8), F)},
        {"w": weights(8, 16), "bias": weights(8)},
        tol=lambda s: float_tol(s, lambda s: 16),
        expect=BLOCKED,
    )


def reductions() -> Case:
    """ReduceSum and ReduceMax along S (dropping it) and along the other axis (keeping)."""
    return case(
        [
            node("ReduceSum", ["x", "a0"], ["sum_s"], keepdims=0),
            node("ReduceSum", ["x", "a1"], ["sum_e"], keepdims=1),
            node("ReduceMax", ["x"], ["max_s"], axes=[0], keepdims=0),
            node("ReduceMax", ["x"], ["max_e"], axes=[1], keepdims=1),
        ],
        {"x": (("S", 8), F)},
        {
            "sum_s": ((8,), F),
            "sum_e": (("S", 1), F),
            "max_s": ((8,), F),
            "max_e": (("S", 1), F),
        },
        {"a0": ints(0), "a1": ints(1)},
        tol=lambda s: float_tol(s, lambda s: s),
    )


def softmax() -> Case:
    """Softmax of [S, 8] over S (axis 0) and over the other axis."""
    return case(
        [
            node("Softmax", ["x"], ["over_s"], axis=0),
            node("Softmax", ["x"], ["over_e"], axis=-1),
        ],
        {"x": (("S", 8), F)},
        {"over_s": (("S", 8), F), "over_e": (("S", 8), F)},
    )


def layer_norm() -> Case:
    """LayerNormalization of [S, 16] over its last axis."""
    return case(
        [node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1)],
        {"x": (("S", 16), F)},
        {"y": (("S", 16), F)},
        {"gamma": weights(16), "beta": weights(16)},
        expect=BLOCKED,
    )


def layer_norm_over_s() -> Case:
    """LayerNormalization of [4, S] over S (scale and bias [1]): its 1 / S is a float
    constant that depends on the size (falls back)."""
    return case(
        [node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1)],
        {"x": ((4, "S"), F)},
        {"y": ((4, "S"), F)},
        {"gamma": weights(1), "beta": weights(1)},
        tol=lambda s: float_tol(s, lambda s: s),
        expect=SIZE_CONSTANT,
    )


def mean_over_s() -> Case:
    """ReduceMean over S: falls back as LayerNormalization over S does."""
    return case(
        [node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=0)],
        {"x": (("S", 8), F)},
        {"y": ((8,), F)},
        tol=lambda s: float_tol(s, lambda s: s),
        expect=SIZE_CONSTANT,
    )


def gather() -> Case:
    """Gather rows of an [11, 4] table by S indices (negative ones too)."""
    return case(
        [node("Gather", ["table", "ids"], ["y"], axis=0)],
        {"ids": (("S",), np.int64)},
        {"y": (("S", 4), F)},
        {"table": weights(11, 4)},
        low={"ids": -11},
        expect=BLOCKED,
    )


def computed_shapes() -> Case:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape (as exporters emit), then Slice
    and Concat along the static axis."""
    nodes, constants = reshaped_by_its_shape()
    return case(
        nodes,
        {"x": (("S", 3, 4), F)},
        {"y": (("S", 20), F)},
        constants,
        expect=BLOCKED,
    )


def slice_along_s() -> Case:
    """Slice rows 1.. and ..-1 of S (empty at S = 1)."""
    return case(
        [
            node("Slice", ["x", "one1", "big", "zero1"], ["tail"]),
            node("Slice", ["x", "zero1", "minus1", "zero1"], ["head"]),
            node("Neg", ["head"], ["y"]),
        ],
        {"x": (("S", 4), F)},
        {"tail": ((None, 4), F), "y": ((None, 4), F)},
        {"zero1": ints(0), "one1": ints(1), "minus1": ints(-1), "big": ints(2**62)},
    )


def concat_along_s() -> Case:
    """Concat of a computed [S, 4] and an input [S, 4] along S."""
    return case(
        [node("Relu", ["x"], ["r"]), node("Concat", ["r", "x"], ["y"], axis=0)],
        {"x": (("S", 4), F)},
        {"y": ((None, 4), F)},
    )


def slice_into_concat() -> Case:
    """A Slice of S concatenated after the input along S: the slice's place in the
    concat starts at 4 * S elements, a size-dependent offset (falls back)."""
    return case(
        [
            node("Slice", ["x", "one1", "big", "zero1"], ["tail"]),
            node("Concat", ["x", "tail"], ["both"], axis=0),
        ],
        {"x": (("S", 4), F)},
        {"both": ((None, 4), F)},
        {"zero1": ints(0), "one1": ints(1), "big": ints(2**62)},
        expect=r"where part 'tail' starts depends on the sizes",
    )


def flatten_from_shape() -> Case:
    """Reshape of [S, 4] to [1, S * 4], the target computed by Shape/ReduceProd/Concat."""
    return case(
        [
            node("Relu", ["x"], ["r"]),
            node("Shape", ["x"], ["shape"]),
            node("ReduceProd", ["shape"], ["count"], keepdims=1),
            node("Concat", ["one1", "count"], ["target"], axis=0),
            node("Reshape", ["r", "target"], ["row"]),
        ],
        {"x": (("S", 4), F)},
        {"row": ((1, None), F)},
        {"one1": ints(1)},
        expect=BLOCKED,
    )


def transpose() -> Case:
    """Transpose [S, 3, 5] to [5, S, 3]."""
    return case(
        [node("Transpose", ["x"], ["y"], perm=[2, 0, 1])],
        {"x": (("S", 3, 5), F)},
        {"y": ((5, "S", 3), F)},
        expect=BLOCKED,
    )


def attention(embed: int = 16, heads: int = 4) -> Case:
    """Self-attention block on [1, S, E] with Reshape targets from Shape/Gather/Concat,
    a residual, LayerNormalization and a ReLU feed-forward (as /tmp/pt/attn.py)."""
    hd = embed // heads
    nodes = [
        node("Shape", ["x"], ["shp"]),
        node("Gather", ["shp", "one"], ["s"], axis=0),
        node("Unsqueeze", ["s", "ax0"], ["s1"]),
        node("Concat", ["b1", "s1", "hd"], ["split"], axis=0),
        node("Concat", ["b1", "s1", "e"], ["merge"], axis=0),
    ]
    for p in "qkv":
        nodes += [
            node("MatMul", ["x", f"w{p}"], [f"{p}0"]),
            node("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
            node("Reshape", [f"{p}1", "split"], [f"{p}2"]),
            node("Transpose", [f"{p}2"], [f"{p}3"], perm=[0, 2, 1, 3]),
        ]
    nodes += [
        node("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q3", "kt"], ["qk"]),
        node("Mul", ["qk", "scale"], ["qks"]),
        node("Softmax", ["qks"], ["att"], axis=-1),
        node("MatMul", ["att", "v3"], ["o"]),
        node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        node("Reshape", ["ot", "merge"], ["o2"]),
        node("MatMul", ["o2", "wo"], ["o3"]),
        node("Add", ["o3", "x"], ["r"]),
        node("LayerNormalization", ["r", "g", "bb"], ["ln"], axis=-1),
        node("MatMul", ["ln", "w1"], ["f1"]),
        node("Relu", ["f1"], ["f2"]),
        node("MatMul", ["f2", "w2"], ["f3"]),
        node("Add", ["f3", "ln"], ["y"]),
    ]
    constants = {f"w{p}": weights(embed, embed) * 0.5 for p in "qkvo"}
    constants |= {f"b{p}": weights(embed) for p in "qkv"}
    constants |= {"g": weights(embed), "bb": weights(embed)}
    constants |= {"w1": weights(embed, 2 * embed) * 0.5, "w2": weights(2 * embed, embed) * 0.5}
    constants |= {
        "one": np.array(1, np.int64),
        "ax0": ints(0),
        "b1": ints(1),
        "hd": ints(heads, hd),
        "e": ints(embed),
        "scale": np.array([1 / np.sqrt(hd)], F),
    }
    return case(
        nodes,
        {"x": ((1, "S", embed), F)},
        {"y": ((1, "S", embed), F)},
        constants,
        tol=lambda s: {"rtol": 2e-4, "atol": 2e-4},
    )


CASES: dict[str, Callable[[], Case]] = {
    "add_broadcast": add_broadcast,
    "mul_broadcast": mul_broadcast,
    "matmul_rows": matmul_rows,
    "matmul_contraction": matmul_contraction,
    "matmul_columns": matmul_columns,
    "gemm": gemm,
    "reductions": reductions,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "layer_norm_over_s": layer_norm_over_s,
    "gather": gather,
    "computed_shapes": computed_shapes,
    "slice_along_s": slice_along_s,
    "concat_along_s": concat_along_s,
    "slice_into_concat": slice_into_concat,
    "flatten_from_shape": flatten_from_shape,
    "mean_over_s": mean_over_s,
    "transpose": transpose,
    "attention": attention,
}


def direct_parametric(model: onnx.ModelProto) -> ParametricModel:
    """The model compiled with S as a parameter without a session (for a model whose S
    the session runs as a batch, in blocks)."""

    def load(shapes):
        return load_graph(
            model, merge=False, supported_ops=supported_ops(), input_shapes=shapes, checked=True
        )

    graph = load_graph(model, supported_ops=supported_ops(), checked=True)
    return compile_parametric(["S"], graph_at(graph.inputs, load))


class Harness:
    """A case with one polyonnx session and one onnxruntime session, shared by every
    example of the case (so that the one compile is the session's first); for a BLOCKED
    case its directly compiled parametric model too."""

    def __init__(self, case: Case):
        self.case = case
        self.session = InferenceSession(case.model, threads=1, cache=False)
        self.reference = onnxruntime.InferenceSession(
            case.model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        self.direct = direct_parametric(case.model) if case.expect == BLOCKED else None
        self.shapes: set[tuple] = set()
        self.feed: dict[str, np.ndarray] = {}

    def check(self, s: int, seed: int = 0) -> None:
        """Run size ``s`` through both sessions (and the direct model); assert they agree."""
        self.feed = feed = self.case.feed(s, seed)
        self.shapes.add(tuple(a.shape for a in feed.values()))
        names = [o.name for o in self.reference.get_outputs()]
        want = self.reference.run(None, feed)
        runs = {"session": self.session.run(None, feed)}
        if self.direct is not None:
            results = self.direct.run(feed)
            runs["direct parametric model"] = [results[n] for n in names]
        for runner, got in runs.items():
            for name, actual, expected in zip(names, got, want, strict=True):
                try:
                    assert_matches(actual, expected, self.case.tol(s))
                except AssertionError as exc:
                    raise AssertionError(f"{runner}: output {name!r} at S={s}: {exc}") from None

    def check_compiles(self) -> None:
        """What the case expects: one parametric compile with poisoned intermediates; one
        compile run in blocks (and a parametric model compiled directly); or a fallback for
        its reason, one compile per shape run."""
        session, expect = self.session, self.case.expect
        if expect == PARAMETRIC:
            assert isinstance(session._parametric, ParametricModel), session.not_parametric
            assert session.not_parametric is None
            assert session.compile_count == 1
            assert session._parametric._poison
            assert session._parametric.symbols == ("S",)
            assert isinstance(session.runner_for(self.feed), ParametricModel)
        elif expect == BLOCKED:
            assert isinstance(session.runner_for(self.feed), Blocked), session.not_blocked
            assert session.compile_count == 1
            assert session._parametric is False  # never needed
            assert isinstance(self.direct, ParametricModel)
            assert self.direct._poison and self.direct.symbols == ("S",)
        else:
            assert session._parametric is None
            assert re.search(expect, session.not_parametric or ""), session.not_parametric
            assert session.compile_count == len(self.shapes)


@pytest.fixture(scope="module")
def harnesses():
    """Sessions made (and first run) with POLYONNX_POISON_ARENA=1, one per case."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(POISON, "1")
        yield {}


def harness(harnesses: dict, name: str) -> Harness:
    if name not in harnesses:
        harnesses[name] = run = Harness(CASES[name]())
        for s in FIRST:
            run.check(s, seed=s)
    return harnesses[name]


@pytest.mark.parametrize("name", list(CASES))
@fast(max_examples=8)
@given(sizes=SIZES, seed=st.integers(0, 2**16))
def test_symbolic_sizes_compile_once(harnesses, name, sizes, seed):
    """Every size of a sequence matches onnxruntime; the session compiled once in all
    (or, for a case expected to fall back, per shape and saying why)."""
    run = harness(harnesses, name)
    for s in sizes:
        run.check(s, seed)
    run.check_compiles()


def two_inputs() -> Case:
    """[4, S] x [S, 6]: two inputs share S, which is not a batch (it is contracted)."""
    return case(
        [node("MatMul", ["a", "b"], ["y"])],
        {"a": ((4, "S"), F), "b": (("S", 6), F)},
        {"y": ((4, 6), F)},
    )


def test_inputs_that_disagree_on_s_name_both(harnesses):
    """Inputs sharing S at different sizes: InputError naming both, first and after the
    compile; the parametric model's own check names both too."""
    run = Harness(two_inputs())
    bad = run.case.feed(5, 0) | {"b": run.case.feed(7, 0)["b"]}
    with pytest.raises(InputError, match=r"'b'.*'S'.*'a'.*5.*7"):
        run.session.run(None, bad)
    assert run.session.compile_count == 0
    run.check(9)
    with pytest.raises(InputError, match=r"'b'.*'S'.*'a'.*5.*7"):
        run.session.run(None, bad)
    with pytest.raises(InputError, match=r"'a' and 'b'.*'S'.*5 and 7"):
        run.session._parametric.point(bad)
    run.check(3)
    run.check_compiles()
