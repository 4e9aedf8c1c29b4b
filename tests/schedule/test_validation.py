"""The schedule API validates its arguments: a malformed trace given to ``prog.apply`` or a
bad argument to a primitive raises ScheduleError naming the step, the argument and what
was expected, never KeyError, TypeError or AttributeError (issue 40)."""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import polyonnx as po
from polyonnx.errors import ScheduleError
from polyonnx.schedule.schedule import REPLAY


def _matmul():
    def f(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    node = helper.make_node("MatMul", ["x", "b"], ["y"], name="k")
    graph = helper.make_graph([node], "g", [f("x", [16, 8]), f("b", [8, 24])], [f("y", [16, 24])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


MODEL = _matmul()
RNG = np.random.default_rng(0)
X = RNG.standard_normal((16, 8)).astype(np.float32)
B = RNG.standard_normal((8, 24)).astype(np.float32)


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        (None, r"a trace is a list of steps .* given NoneType"),
        ("split", r"a trace is a list of steps .* given str"),
        ({"kernel": "k"}, r"a trace is a list of steps .* given dict"),
        ([None], r"trace step 0 must be a mapping .* given NoneType"),
        ([{"primitive": "split", "args": {}}], r"trace step 0: 'kernel' must name a kernel"),
        ([{"kernel": 3, "primitive": "split", "args": {}}], r"'kernel' must name .* given 3"),
        ([{"kernel": "nope", "primitive": "split", "args": {}}], r"no kernel named 'nope'"),
        ([{"kernel": "k", "args": {}}], r"trace step 0: unknown primitive None"),
        ([{"kernel": "k", "primitive": ["split"], "args": {}}], r"unknown primitive \['split'\]"),
        ([{"kernel": "k", "primitive": "split"}], r"step 0 \(split\): 'args' must be a mapping"),
        ([{"kernel": "k", "primitive": "split", "args": None}], r"'args' must be a mapping"),
        ([{"kernel": "k", "primitive": "split", "args": {1: 2}}], r"'args' must be a mapping"),
        (
            [{"kernel": "k", "primitive": "split", "args": {"loop": "i"}}],
            r"trace step 0 \(split\): missing a required argument: 'factor'; its args are "
            r"loop, factor",
        ),
        (
            [{"kernel": "k", "primitive": "split", "args": {"loop": "i", "factor": 2, "x": 1}}],
            r"unexpected keyword argument 'x'",
        ),
        (
            [{"kernel": "k", "primitive": "split", "args": {"loop": "i", "factor": "4"}}],
            r"split\(i, '4'\): the factor must be a positive int.* given str",
        ),
        (
            [{"kernel": "k", "primitive": "split", "args": {"loop": None, "factor": 4}}],
            r"split: a loop is a Loop or a loop name \(str\), given NoneType None",
        ),
        (
            [{"kernel": "k", "primitive": "reorder", "args": {"loops": "ij"}}],
            r"trace step 0 \(reorder\): 'loops' must be a list of loop names, given 'ij'",
        ),
        ([{"kernel": "k", "primitive": "tile", "args": {}}], r"\(tile\): its args need 'loops'"),
        (
            [{"kernel": "k", "primitive": "ukernel", "args": {"params": ["mr"]}}],
            r"\(ukernel\): 'params' must be a mapping of names to values",
        ),
    ],
)
def test_a_malformed_trace_is_refused_by_name(trace, expected):
    prog = po.load(MODEL)
    with pytest.raises(ScheduleError, match=expected):
        prog.apply(trace)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda s: s.ukernel(mr="a"), r"ukernel: mr must be an int, given str 'a'"),
        (lambda s: s.ukernel(split=2), r"ukernel: split must be a str, given int"),
        (lambda s: s.ukernel(kc=True), r"ukernel: kc must be an int, given bool"),
        (lambda s: s.ukernel(nc=2**80), r"ukernel: nc=\d+ is out of range"),
        (lambda s: s.ukernel(mr=2.5), r"ukernel: mr must be an int, given float"),
        (lambda s: s.split("i", 0), r"split\(i, 0\): the factor must be a positive int"),
        (lambda s: s.split("i", -3), r"split\(i, -3\): the factor must be a positive int"),
        (lambda s: s.split("i", True), r"split\(i, True\): .* given bool"),
        (lambda s: s.split("i", 2.0), r"split\(i, 2.0\): .* given float"),
        (lambda s: s.split("i", 2**70), r"the factor must be a positive int, at most 2\*\*62"),
        (lambda s: s.split(3, 2), r"split: a loop is a Loop or a loop name \(str\), given int"),
        (lambda s: s.reorder("i", "i"), r"reorder\(i, i\): a loop is named twice"),
        (lambda s: s.vectorize("nope"), r"vectorize\(nope\): kernel 'k' has no loop 'nope'"),
        (lambda s: s.parallel(["i"]), r"parallel: a loop is a Loop or a loop name"),
        (lambda s: s.tile("i", "j", sizes=None), r"tile\(i, j\): give one size per loop"),
        (lambda s: s.tile("i", "j", sizes="44"), r"tile\(i, j\): give one size per loop"),
        (lambda s: s.unroll("k", 0), r"unroll\(k, 0\): the factor must be a positive int"),
        (lambda s: s.unroll("k", 1.5), r"unroll\(k, 1.5\): the factor must be a positive"),
        (lambda s: s.pack(["b"], at="i"), r"pack\(\['b'\], at=i\): kernel 'k' has no buffer"),
        (lambda s: s.compute_at(None, "i"), r"compute_at\(None, i\): name a kernel"),
    ],
)
def test_a_bad_primitive_argument_is_refused_by_name(call, expected):
    s = po.load(MODEL).schedule("k")
    before = str(s)
    with pytest.raises(ScheduleError, match=expected):
        call(s)
    assert str(s) == before and s.trace == []


def test_numpy_integers_are_factors():
    s = po.load(MODEL).schedule("k")
    s.split("i", np.int64(4))
    assert s.trace[0]["args"]["factor"] == 4


def test_schedule_names_must_be_strings():
    with pytest.raises(ScheduleError, match=r"schedule\(\) takes kernel names"):
        po.load(MODEL).schedule(None)


LOOPS = ["i", "j", "k", "i_o", "i_i", "j_o", "j_i", "nope", ""]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.sampled_from([*LOOPS, "b", "x", "y", "none", "rows"]),
    st.text(max_size=4),
    st.lists(st.sampled_from(LOOPS), max_size=4),
    st.dictionaries(st.sampled_from(["mr", "nr", "kc", "split", "bogus"]), st.integers(-2, 64)),
    st.tuples(st.integers(0, 9)),
)
PARAMETERS = {
    name: [p for p in inspect.signature(r.method).parameters if p != "self"]
    for name, r in REPLAY.items()
}


@st.composite
def steps(draw):
    """A trace step, often nearly right: a known primitive with its own argument names
    (some dropped, some added) holding any values, or a damaged step."""
    primitive = draw(st.sampled_from([*REPLAY, "swizzle"]))
    names = PARAMETERS.get(primitive, []) + draw(st.lists(st.sampled_from(["factor", "z"])))
    args = {n: draw(VALUES) for n in names if draw(st.integers(0, 5))}
    step = {"kernel": "k", "primitive": primitive, "args": args}
    damage = draw(st.integers(0, 9))
    if damage == 1:
        step.pop(draw(st.sampled_from(sorted(step))))
    elif damage == 2:
        step[draw(st.sampled_from(sorted(step)))] = draw(VALUES)
    elif damage == 3:
        return draw(VALUES)
    return step


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps(), min_size=1, max_size=3))
def test_any_malformed_trace_raises_only_schedule_errors(trace):
    prog = po.load(MODEL)
    try:
        prog.apply(trace)
    except ScheduleError as error:
        assert str(error)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "kernel": st.just("k"),
                "primitive": st.sampled_from(["split", "unroll", "vectorize", "parallel"]),
                "args": st.fixed_dictionaries(
                    {"loop": st.sampled_from(["i", "j", "k", "i_i", "j_i"])},
                    optional={"factor": st.one_of(st.integers(-1, 9), st.booleans())},
                ),
            }
        ),
        min_size=1,
        max_size=3,
    )
)
def test_what_a_random_trace_leaves_computes_the_product(trace):
    prog = po.load(MODEL)
    for step in trace:  # step by step: a refused step leaves the ones before it
        with contextlib.suppress(ScheduleError):
            prog.apply([step])
    (got,) = po.InferenceSession(prog, threads=2).run(None, {"x": X, "b": B})
    np.testing.assert_allclose(got, X @ B, rtol=1e-5, atol=1e-5)
