"""The scripting API on a model whose symbolic dims are isl parameters: polyonnx.load
gives the parametric program, a step on one of its kernels is checked against the
dependences for every value of the parameters, and the session compiles the script once
for every size."""

from __future__ import annotations

import onnxruntime
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx as po
from polyonnx.program import ParametricProgram
from polyonnx.runtime.compiled import POISON
from polyonnx.runtime.parametric import ParametricModel
from tests.helpers import assert_matches, fast
from tests.runtime.test_parametric import CASES, SIZES


@pytest.fixture(scope="module")
def scripted():
    """The attention case with its Softmax kernel tiled along S by 8 (S is rarely a
    multiple), the tiles on threads; compiled with a poisoned arena."""
    case = CASES["attention"]()
    prog = po.load(case.model)
    assert isinstance(prog, ParametricProgram)
    s = prog.schedule("att")
    rows = s.loops[2]  # d2: the query position, 0 <= d2 < S
    outer, _ = s.tile(rows, sizes=[8])
    s.parallel(outer)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(POISON, "1")
        session = po.InferenceSession(prog, threads=2)
    reference = onnxruntime.InferenceSession(case.model.SerializeToString())
    return case, prog, session, reference


def test_the_script_shows_the_parameters(scripted):
    _, prog, _, _ = scripted
    text = str(prog.schedule("att"))
    assert "< S;" in text and "d2_o" in text


@fast(max_examples=6)
@given(sizes=SIZES, seed=st.integers(0, 2**16))
def test_a_scripted_parametric_program_runs_every_size(scripted, sizes, seed):
    case, _, session, reference = scripted
    for s in (1, *sizes):
        feed = case.feed(s, seed)
        assert_matches(session.run(None, feed)[0], reference.run(None, feed)[0], case.tol(s))
    assert isinstance(session.runner_for(feed), ParametricModel)
    assert session.compile_count == 1


def test_illegal_and_sized_steps_are_refused():
    case = CASES["attention"]()
    prog = po.load(case.model)
    s = prog.schedule("att")
    reduction = s.loops[-1]  # r3: summed over, for every S
    with pytest.raises(po.ScheduleError, match="parallel"):
        s.parallel(reduction)
    with pytest.raises(po.ScheduleError, match=r"ukernel\(\): kernel 'q0' has run-time sizes"):
        prog.schedule("q0").ukernel(mr=8)
    with pytest.raises(po.ScheduleError, match="one at a time"):
        prog.schedule("q0", "q1")


def test_a_model_that_is_not_parametric_asks_for_shapes():
    with pytest.raises(po.ScheduleError, match=r"need input_shapes.*not parametric: where part"):
        po.load(CASES["slice_into_concat"]().model)
