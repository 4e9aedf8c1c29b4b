"""The proof that a symbolic dim is a batch (frontend/batch.py): models that mix samples
along it are not run in blocks (and still run right, compiled per size); models that keep
them apart get the plan their shapes say, even where a reshape merges an outer dim in."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

import polyonnx
from polyonnx.frontend import load_graph
from polyonnx.frontend.batch import Batched, NotBatched, batch_plan
from polyonnx.runtime.blocks import Blocked
from polyonnx.runtime.parametric import ParametricModel
from tests.helpers import assert_matches, make_model, sum_tol, value_info

F = np.float32


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def model(nodes, inputs, outputs, constants=None, opset=18) -> onnx.ModelProto:
    """``inputs``/``outputs``: name -> shape, or (shape, dtype) where not float32."""

    def infos(values):
        return [value_info(name, *_typed(spec)[::-1]) for name, spec in values.items()]

    return make_model(nodes, infos(inputs), infos(outputs), constants, opset)


def _typed(spec) -> tuple[tuple, type]:
    """(shape, dtype) of an input or output spec."""
    return (spec[0], spec[1]) if isinstance(spec[-1], type) else (spec, F)


def node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def feed_of(m: onnx.ModelProto, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 inputs of ``m`` with the dim "N" made ``n``."""
    rng = np.random.default_rng(seed)
    feed = {}
    for v in m.graph.input:
        dims = [n if d.dim_param == "N" else d.dim_value for d in v.type.tensor_type.shape.dim]
        feed[v.name] = rng.uniform(-2, 2, dims).astype(F)
    return feed


def check_against_onnxruntime(m: onnx.ModelProto, session, n: int) -> dict[str, np.ndarray]:
    """Run ``n`` samples through ``session`` and onnxruntime; assert they agree."""
    feed = feed_of(m, n, seed=n)
    reference = onnxruntime.InferenceSession(
        m.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for actual, expected in zip(session.run(None, feed), reference.run(None, feed), strict=True):
        assert_matches(actual, expected, sum_tol(64))
    return feed


# ---- models that mix samples ----------------------------------------------------


def reduce_sum_over_batch():
    return model(
        [node("ReduceSum", ["x", "axes"], ["mix"], keepdims=1)],
        {"x": ("N", 4)},
        {"mix": (1, 4)},
        {"axes": ints(0)},
    )


def softmax_over_batch():
    return model([node("Softmax", ["x"], ["mix"], axis=0)], {"x": ("N", 4)}, {"mix": ("N", 4)})


def gram_matrix():
    """x^T x: the MatMul contracts along the batch."""
    return model(
        [node("Transpose", ["x"], ["xt"], perm=[1, 0]), node("MatMul", ["xt", "x"], ["mix"])],
        {"x": ("N", 4)},
        {"mix": (4, 4)},
    )


def gather_samples():
    return model(
        [node("Gather", ["x", "picks"], ["mix"], axis=0)],
        {"x": ("N", 4)},
        {"mix": (2, 4)},
        {"picks": ints(1, 0)},
    )


def concat_over_batch():
    return model([node("Concat", ["x", "x"], ["mix"], axis=0)], {"x": ("N", 4)}, {"mix": ("N2", 4)})


def unflatten_transposed():
    """[N, 6] -> [6, N] -> [6N] -> [N, 6]: row n of the result takes entries of other
    samples."""
    return model(
        [
            node("Transpose", ["x"], ["xt"], perm=[1, 0]),
            node("Reshape", ["xt", "flat_shape"], ["flat"]),
            node("Reshape", ["flat", "rows_shape"], ["mix"]),
        ],
        {"x": ("N", 6)},
        {"mix": ("N", 6)},
        {"flat_shape": ints(-1), "rows_shape": ints(-1, 6)},
    )


def range_of_batch():
    """x + Range(0, N): the added value is computed from the batch size."""
    return model(
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "zero"], ["n"], axis=0),
            node("Range", ["start", "n", "step"], ["r"]),
            node("Cast", ["r"], ["rf"], to=onnx.TensorProto.FLOAT),
            node("Add", ["x", "rf"], ["mix"]),
        ],
        {"x": ("N",)},
        {"mix": ("N",)},
        {
            "zero": np.array(0, np.int64),
            "start": np.array(0, np.int64),
            "step": np.array(1, np.int64),
        },
    )


def flatten_then_softmax():
    """Flatten at axis 0 puts every sample in one row; the Softmax along it mixes them."""
    return model(
        [node("Flatten", ["x"], ["flat"], axis=0), node("Softmax", ["flat"], ["mix"], axis=1)],
        {"x": ("N", 3)},
        {"mix": (1, "N3")},
    )


def top_k_over_batch():
    return model(
        [node("TopK", ["x", "k"], ["mix", "indices"], axis=0)],
        {"x": ("N", 4)},
        {"mix": (2, 4), "indices": ((2, 4), np.int64)},
        {"k": ints(2)},
    )


def cum_sum_over_batch():
    return model(
        [node("CumSum", ["x", "axis"], ["mix"])],
        {"x": ("N", 4)},
        {"mix": ("N", 4)},
        {"axis": np.array(0, np.int64)},
    )


MIXING = {
    "reduce_sum": reduce_sum_over_batch,
    "softmax": softmax_over_batch,
    "gram": gram_matrix,
    "gather": gather_samples,
    "concat": concat_over_batch,
    "unflatten_transposed": unflatten_transposed,
    "range": range_of_batch,
    "flatten_softmax": flatten_then_softmax,
    "top_k": top_k_over_batch,
    "cum_sum": cum_sum_over_batch,
}


def runs_right(m: onnx.ModelProto, sizes):
    """One session of ``m``, checked against onnxruntime at each batch size of ``sizes``;
    the session and the feeds."""
    session = polyonnx.InferenceSession(m, threads=1, cache=False)
    return session, [check_against_onnxruntime(m, session, n) for n in sizes]


PER_SIZE = {"gather"}
"""Mixing models the fit refuses (a size in a kernel's expression: a bound checked at
run time, a mean's 1/N), still compiled once per size."""


@pytest.mark.parametrize("name", list(MIXING))
def test_mixing_models_are_compiled_once_with_parameters(name):
    """Refused as a batch with the node that mixes named; compiled once with N as an isl
    parameter instead (runtime/parametric.py), and right at each size."""
    m = MIXING[name]()
    session, feeds = runs_right(m, (2, 5))
    assert "N" in session.not_blocked
    if name != "range":  # refused where Range's sum is read: the Add
        assert "'mix'" in session.not_blocked["N"], session.not_blocked["N"]
    runners = [session.runner_for(feed) for feed in feeds]
    if name in PER_SIZE:
        assert session.not_parametric, name
        assert session.compile_count == 2
    else:
        assert all(isinstance(r, ParametricModel) for r in runners), session.not_parametric
        assert session.compile_count == 1


def test_range_of_the_batch_is_refused_where_it_is_read():
    session = polyonnx.InferenceSession(range_of_batch(), threads=1, cache=False)
    session.run(None, feed_of(range_of_batch(), 3))
    assert "computed from the batch size" in session.not_blocked["N"]


# ---- models that keep samples apart ------------------------------------------------


def run_blocked(m: onnx.ModelProto, sizes=(1, 3, 2, 5)):
    """Run ``m`` at ``sizes`` through one session: right at each, one compile, blocked."""
    session = polyonnx.InferenceSession(m, threads=1, cache=False)
    for n in sizes:
        feed = check_against_onnxruntime(m, session, n)
    runner = session.runner_for(feed)
    assert isinstance(runner, Blocked), session.not_blocked
    assert session.compile_count == 1
    return runner.plan


def test_batch_normalization_in_inference_is_per_sample():
    rng = np.random.default_rng(1)
    params = {k: rng.uniform(0.5, 1.5, 3).astype(F) for k in ("scale", "bias", "mean", "var")}
    m = model(
        [node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"])],
        {"x": ("N", 3, 5, 5)},
        {"y": ("N", 3, 5, 5)},
        params,
    )
    assert run_blocked(m).outputs["y"] == Batched(0, rows=1)


def test_flatten_of_the_transposed_batch_keeps_samples_apart():
    """[N, 6] -> [6, N] -> [6N]: sample n is at n, N + n, ...: outer 6, one row each."""
    m = model(
        [
            node("Transpose", ["x"], ["xt"], perm=[1, 0]),
            node("Reshape", ["xt", "flat_shape"], ["flat"]),
            node("Relu", ["flat"], ["y"]),
        ],
        {"x": ("N", 6)},
        {"y": ("N6",)},
        {"flat_shape": ints(-1)},
    )
    plan = run_blocked(m)
    assert plan.outputs["y"] == Batched(0, rows=1, outer=6)


def test_flatten_at_axis_zero_alone_keeps_samples_apart():
    """[N, 3] -> [1, 3N]: each sample's three entries in a run along axis 1."""
    m = model([node("Flatten", ["x"], ["y"], axis=0)], {"x": ("N", 3)}, {"y": (1, "N3")})
    plan = run_blocked(m)
    assert plan.outputs["y"] == Batched(1, rows=3)


def sequence_first(seq: int = 4, embed: int = 6) -> onnx.ModelProto:
    """torch's sequence-first projection: [N,S,E] -> [S,N,E] -> [S*N,E] -> Gemm ->
    [S,N,E] -> [N,S,E]; the merged value an output too."""
    rng = np.random.default_rng(2)
    return model(
        [
            node("Transpose", ["x"], ["sne"], perm=[1, 0, 2]),
            node("Reshape", ["sne", "merged_shape"], ["merged"]),
            node("Gemm", ["merged", "w", "b"], ["projected"], transB=1),
            node("Reshape", ["projected", "split_shape"], ["sne2"]),
            node("Transpose", ["sne2"], ["y"], perm=[1, 0, 2]),
        ],
        {"x": ("N", seq, embed)},
        {"merged": ("SN", embed), "y": ("N", seq, embed)},
        {
            "merged_shape": ints(-1, embed),
            "split_shape": ints(seq, -1, embed),
            "w": rng.uniform(-1, 1, (embed, embed)).astype(F),
            "b": rng.uniform(-1, 1, embed).astype(F),
        },
    )


def test_sequence_first_projection_is_blocked():
    plan = run_blocked(sequence_first())
    assert plan.outputs["merged"] == Batched(0, rows=1, outer=4)
    assert plan.outputs["y"] == Batched(0, rows=1)


# ---- batch_plan on the specialised graphs ------------------------------------------


def graphs(m: onnx.ModelProto, shapes_at):
    """``batch_plan``'s arguments: ``m`` loaded with N symbolic and at 1, 2 and 3 samples
    (duplicates not merged); ``shapes_at(n)``: its input shapes."""
    symbolic, *sized = (
        load_graph(m, input_shapes=shapes_at(n), merge=False) for n in ("N", 1, 2, 3)
    )
    return symbolic, tuple(sized)


def test_plan_follows_a_transpose_inward():
    m = model(
        [
            node("Transpose", ["x"], ["inward"], perm=[1, 0, 2]),
            node("Reshape", ["x", "rows_shape"], ["rows"]),
        ],
        {"x": ("N", 3, 4)},
        {"inward": (3, "N", 4), "rows": ("N3", 4)},
        {"rows_shape": ints(-1, 4)},
    )
    plan = batch_plan("N", *graphs(m, lambda n: {"x": (n, 3, 4)}))
    assert plan.symbol == "N"
    assert plan.inputs["x"] == Batched(0, rows=1)
    assert plan.outputs["inward"] == Batched(axis=1, rows=1)
    assert plan.outputs["rows"] == Batched(0, rows=3)


def test_plan_of_sequence_first_merges_the_sequence_outer():
    plan = batch_plan("N", *graphs(sequence_first(), lambda n: {"x": (n, 4, 6)}))
    assert plan.outputs["merged"] == Batched(0, rows=1, outer=4)
    assert plan.outputs["merged"].factor == 4


def test_plan_leaves_unbatched_inputs_and_outputs_out():
    """A weight given as an input has no batch; an output of it alone neither."""
    m = model(
        [node("MatMul", ["x", "w"], ["y"]), node("Relu", ["w"], ["w_out"])],
        {"x": ("N", 4), "w": (4, 5)},
        {"y": ("N", 5), "w_out": (4, 5)},
    )
    plan = batch_plan("N", *graphs(m, lambda n: {"x": (n, 4), "w": (4, 5)}))
    assert plan.inputs == {"x": Batched(0, 1), "w": None}
    assert plan.outputs == {"y": Batched(0, 1), "w_out": None}


@pytest.mark.parametrize("name", ["reduce_sum", "softmax", "gram", "cum_sum"])  # top_k: no k at 1
def test_plan_refuses_the_mixing_node(name):
    m = MIXING[name]()
    with pytest.raises(NotBatched, match="'mix'"):
        batch_plan("N", *graphs(m, lambda n: {"x": (n, 4)}))


def test_plan_needs_a_batched_input():
    """A symbol whose dims are equal in both graphs carries no batch."""
    m = model([node("Relu", ["x"], ["y"])], {"x": ("N", 4)}, {"y": ("N", 4)})
    same = tuple(load_graph(m, input_shapes={"x": (2, 4)}) for _ in range(3))
    with pytest.raises(NotBatched, match="no input carries 'N'"):
        batch_plan("N", same[0], same)


# ---- values of the batch size that agree at 2 and 3, graphs that differ at 1 ----------


def min_of_batch_and_two():
    """x * min(N, 2): the factor is 2 at both proof sizes, 1 in a one-sample block."""
    return model(
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "zero"], ["n"], axis=0),
            node("Cast", ["n"], ["nf"], to=onnx.TensorProto.FLOAT),
            node("Min", ["nf", "two"], ["factor"]),
            node("Mul", ["x", "factor"], ["y"]),
        ],
        {"x": ("N", 3)},
        {"y": ("N", 3)},
        {"zero": np.array(0, np.int64), "two": np.array(2, F)},
    )


def first_three_samples():
    """x * (Range(0, N) < 3): all ones at both proof sizes (so it looks like the same
    row for every sample), zeros from the fourth sample on."""
    return model(
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "zero"], ["n"], axis=0),
            node("Range", ["zero", "n", "one"], ["r"]),
            node("Less", ["r", "three"], ["keep"]),
            node("Cast", ["keep"], ["keepf"], to=onnx.TensorProto.FLOAT),
            node("Unsqueeze", ["keepf", "axis1"], ["column"]),
            node("Mul", ["x", "column"], ["y"]),
        ],
        {"x": ("N", 3)},
        {"y": ("N", 3)},
        {
            "zero": np.array(0, np.int64),
            "one": np.array(1, np.int64),
            "three": np.array(3, np.int64),
            "axis1": ints(1),
        },
    )


def squeeze_every_unit_dim():
    """Squeeze without axes of [N, 3, 1]: [N, 3] at the proof sizes, but at one sample
    (the block's size) it squeezes the batch too."""
    return model(
        [node("Squeeze", ["x"], ["s"]), node("Relu", ["s"], ["y"])],
        {"x": ("N", 3, 1)},
        {"y": ("N", 3)},
    )


def reshape_to_max_of_batch_and_two():
    """Reshape [N, 6] to [max(N, 2), -1]: [N, 6] at both proof sizes, [2, 3] at one
    sample."""
    return model(
        [
            node("Shape", ["x"], ["n1"], start=0, end=1),
            node("Max", ["n1", "two"], ["rows"]),
            node("Concat", ["rows", "minus1"], ["target"], axis=0),
            node("Reshape", ["x", "target"], ["y"]),
        ],
        {"x": ("N", 6)},
        {"y": ("N", 6)},
        {"two": ints(2), "minus1": ints(-1)},
    )


HOLES = {
    "min_of_batch": min_of_batch_and_two,
    "range_mask": first_three_samples,
    "squeeze_no_axes": squeeze_every_unit_dim,
    "reshape_max": reshape_to_max_of_batch_and_two,
}


@pytest.mark.parametrize("name", list(HOLES))
def test_values_of_the_batch_size_agreeing_at_two_and_three(name):
    """Right at 4 and 5 samples, however the session runs them."""
    m = HOLES[name]()
    session, feeds = runs_right(m, (4, 5))
    reference = onnxruntime.InferenceSession(m.SerializeToString())
    for feed in feeds:
        got, want = session.run(None, feed), reference.run(None, feed)
        assert [a.shape for a in got] == [b.shape for b in want]


def test_top_k_along_its_default_last_axis_is_blocked():
    m = model(
        [node("TopK", ["x", "k"], ["values", "indices"])],
        {"x": ("N", 5)},
        {"values": ("N", 2), "indices": (("N", 2), np.int64)},
        {"k": ints(2)},
    )
    plan = run_blocked(m)
    assert plan.outputs == {"values": Batched(0, 1), "indices": Batched(0, 1)}
