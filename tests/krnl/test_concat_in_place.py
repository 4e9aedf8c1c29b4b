"""A Concat whose parts are computed by the model stores them in place: each producer
writes its slab of the output and no copy runs (krnl/ops/movement.py, Program.slices)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from tests.helpers import fast, make_model, random_array, seeds, value_info


def _session(nodes, inputs, outputs):
    model = make_model(nodes, inputs, outputs)
    return polyonnx.InferenceSession(model, threads=1)


def _program(session, feed):
    return session.compiled_for(feed).program


@fast(25)
@given(
    lead=st.sampled_from([(), (1,), (1, 1), (2,), (1, 3)]),
    sizes=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    tail=st.lists(st.integers(1, 7), max_size=2),
    dtype=st.sampled_from([np.float32, np.int64, np.int8, np.bool_]),
    seed=seeds,
)
def test_computed_parts_go_in_place_where_their_slabs_are_blocks(lead, sizes, tail, dtype, seed):
    """Parts p_i = Not/Neg(x_i), concatenated along the axis after ``lead``: in place
    exactly when every lead dim is 1, and the same values either way."""
    rng = np.random.default_rng(seed)
    axis = len(lead)
    op = "Not" if dtype == np.bool_ else "Neg"
    xs = [random_array(rng, (*lead, n, *tail), dtype, -50, 50) for n in sizes]
    nodes = [helper.make_node(op, [f"x{i}"], [f"p{i}"]) for i in range(len(xs))]
    nodes.append(helper.make_node("Concat", [f"p{i}" for i in range(len(xs))], ["y"], axis=axis))
    shape = (*lead, sum(sizes), *tail)
    session = _session(
        nodes,
        [value_info(f"x{i}", dtype, x.shape) for i, x in enumerate(xs)],
        [value_info("y", dtype, shape)],
    )
    feed = {f"x{i}": x for i, x in enumerate(xs)}
    (y,) = session.run(None, feed)
    parts = [np.logical_not(x) if dtype == np.bool_ else -x for x in xs]
    np.testing.assert_array_equal(y, np.concatenate(parts, axis=axis))
    program = _program(session, feed)
    blocks = all(n == 1 for n in lead)
    assert bool(program.slices) == blocks
    assert any(k.op_type == "Concat" for k in program.kernels) != blocks


@fast(20)
@given(sizes=st.lists(st.integers(1, 6), min_size=3, max_size=5), hw=st.integers(1, 9), seed=seeds)
def test_a_chain_of_concats_reading_each_other_is_computed_in_place(sizes, hw, seed):
    """DenseNet's pattern: c_1 = x_0, c_k = Concat(c_{k-1}, Relu(c_{k-1} * w_k)), each
    c_{k-1} read by the next part before it is stored inside c_k."""
    rng = np.random.default_rng(seed)
    x = random_array(rng, (1, sizes[0], hw, hw))
    nodes, current, want = [helper.make_node("Relu", ["x"], ["c0"])], "c0", np.maximum(x, 0)
    for k, n in enumerate(sizes[1:], 1):
        # part k: the first n channels of c_{k-1}, doubled (a slab read, another written)
        nodes += [
            helper.make_node("Slice", [current, "zero", f"n{k}", "one"], [f"s{k}"]),
            helper.make_node("Add", [f"s{k}", f"s{k}"], [f"p{k}"]),
            helper.make_node("Concat", [current, f"p{k}"], [f"c{k}"], axis=1),
        ]
        part = want[:, : min(n, want.shape[1])] * 2
        want = np.concatenate([want, part], axis=1)
        current = f"c{k}"
    constants = {"zero": np.array([0]), "one": np.array([1])}
    constants |= {f"n{k}": np.array([n]) for k, n in enumerate(sizes[1:], 1)}
    model = make_model(
        nodes,
        [value_info("x", np.float32, x.shape)],
        [value_info(current, np.float32, want.shape)],
        constants,
    )
    session = polyonnx.InferenceSession(model, threads=1)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, want)
    program = _program(session, {"x": x})
    assert not any(k.op_type == "Concat" for k in program.kernels)


def test_parts_that_need_storage_of_their_own_are_copied():
    """A graph input, a graph output, a part given twice and a part with a view keep
    their storage and are copied; the computed one goes in place."""
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)
    nodes = [
        helper.make_node("Neg", ["x"], ["out"]),  # also a graph output
        helper.make_node("Relu", ["x"], ["twice"]),
        helper.make_node("Abs", ["x"], ["viewed"]),
        helper.make_node("Flatten", ["viewed"], ["flat"]),
        helper.make_node("Exp", ["x"], ["alone"]),
        helper.make_node(
            "Concat", ["x", "out", "twice", "twice", "viewed", "alone"], ["y"], axis=1
        ),
    ]
    session = _session(
        nodes,
        [value_info("x", np.float32, x.shape)],
        [
            value_info("y", np.float32, (1, 12, 2, 2)),
            value_info("out", np.float32, x.shape),
            value_info("flat", np.float32, (1, 8)),
        ],
    )
    y, out, flat = session.run(None, {"x": x})
    relu = np.maximum(x, 0)
    want = np.concatenate([x, -x, relu, relu, np.abs(x), np.exp(x)], axis=1)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    np.testing.assert_array_equal(out, -x)
    np.testing.assert_array_equal(flat, np.abs(x).reshape(1, 8))
    assert set(_program(session, {"x": x}).slices) == {"alone"}


def test_an_output_that_views_a_part_gets_storage_of_its_own():
    """Flatten(p) as a graph output, p stored inside the Concat's output: the output is
    a copy, not the Concat's whole storage in an output array of p's size."""
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2)
    nodes = [
        helper.make_node("Neg", ["x"], ["p"]),
        helper.make_node("Relu", ["x"], ["q"]),
        helper.make_node("Concat", ["q", "p"], ["y"], axis=1),
        helper.make_node("Flatten", ["p"], ["flat"]),
    ]
    session = _session(
        nodes,
        [value_info("x", np.float32, x.shape)],
        [value_info("y", np.float32, (1, 6, 2, 2)), value_info("flat", np.float32, (1, 12))],
    )
    y, flat = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.concatenate([np.maximum(x, 0), -x], axis=1))
    np.testing.assert_array_equal(flat, (-x).reshape(1, 12))
