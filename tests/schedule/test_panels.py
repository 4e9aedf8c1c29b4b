"""A GEMM's constant B packed when compiling (schedule/heuristics/panels.py, emit/ukernel.py's
``copy_tile``), against numpy on hypothesis shapes and ukernel parameters: columns past
the last whole panel, K blocks, transposed weights, threads over columns and rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.errors import ScheduleError
from polyonnx.runtime.compiled import lower_model
from polyonnx.schedule.gemm import Params
from polyonnx.schedule.heuristics.panels import MARK, pack_constants, panel_name
from polyonnx.tune.space import space_for
from tests.helpers import fast, make_model, random_array, seeds, sum_tol, value_info

F32 = np.float32
sizes = st.sampled_from((1, 2, 3, 7, 16, 17, 31, 33, 47, 64, 65))


def _gemm_model(w: np.ndarray, m: int, trans_b: int, bias: np.ndarray | None = None):
    k, n = w.shape[::-1] if trans_b else w.shape
    inputs = ["x", "w"] + (["bias"] if bias is not None else [])
    node = helper.make_node("Gemm", inputs, ["y"], name="fc", transB=trans_b)
    tables = {"w": w} | ({"bias": bias} if bias is not None else {})
    return make_model(
        [node], [value_info("x", F32, (m, k))], [value_info("y", F32, (m, n))], tables
    )


def _panels_used(session, feed) -> tuple:
    return session.compiled_for(feed).schedules[0].panels


@fast(30)
@given(
    m=sizes, k=sizes, n=sizes, trans_b=st.sampled_from((0, 1)),
    nr=st.sampled_from((16, 32, 48)), kc=st.sampled_from((1, 7, 64)),
    nc_tiles=st.sampled_from((1, 2, 16)), split=st.sampled_from(("none", "rows", "cols")),
    packb=st.sampled_from((0, 1)), seed=seeds,
)  # fmt: skip
def test_a_gemm_reads_its_weights_packed_once(
    m, k, n, trans_b, nr, kc, nc_tiles, split, packb, seed
):
    rng = np.random.default_rng(seed)
    w = random_array(rng, (n, k) if trans_b else (k, n))
    bias = random_array(rng, (n,))
    prog = polyonnx.load(_gemm_model(w, m, trans_b, bias))
    try:
        prog.schedule("fc").ukernel(nr=nr, kc=kc, nc=nr * nc_tiles, split=split, packb=packb)
    except ScheduleError as e:
        in_place = "packb=0 needs B contiguous" in str(e)  # B[n, k] is not read in place
        assert (packb == 0 and trans_b and in_place) or n < 16 or m < 2 or k < 2
        return
    x = random_array(rng, (m, k))
    session = polyonnx.InferenceSession(prog, threads=2)
    got = session.run(None, {"x": x})[0]
    weights = w.T if trans_b else w
    want = x.astype(np.float64) @ weights.astype(np.float64) + bias
    np.testing.assert_allclose(got, want, **sum_tol(4 * k))
    (copy,) = _panels_used(session, {"x": x})  # w, or w transposed when lowering
    assert copy[1] == panel_name(copy[0], nr)


@pytest.mark.parametrize(("n", "nr", "trans_b"), [(40, 16, 0), (40, 32, 1), (96, 48, 0)])
def test_the_copy_holds_b_a_panel_of_nr_columns_at_a_time(n, nr, trans_b):
    """Column j of row k at [j // NR, k, j % NR], zeros past N."""
    k = 5
    w = np.arange(k * n, dtype=F32).reshape((n, k) if trans_b else (k, n))
    prog = polyonnx.load(_gemm_model(w, 4, trans_b))
    prog.schedule("fc").ukernel(nr=nr, nc=nr)
    program, schedules = prog.compilable()
    packed, after = pack_constants(program, tuple(schedules))
    ((b, name),) = after[0].panels  # w, or its transpose folded when lowering
    assert b in program.constants and name == panel_name(b, nr)
    copy = packed.constants[name]
    weights = w.T if trans_b else w
    want = np.zeros((-(-n // nr), k, nr), F32)
    for j in range(n):
        want[j // nr, :, j % nr] = weights[:, j]
    np.testing.assert_array_equal(copy, want)
    assert copy.ctypes.data % 64 == 0  # the micro-kernel loads whole aligned vectors
    assert Params.from_mark(MARK.search(after[0].tree).group()).nr == nr


def test_b_that_is_an_input_or_one_row_is_not_packed():
    rng = np.random.default_rng(0)
    w = random_array(rng, (64, 48))
    one_row = polyonnx.InferenceSession(_gemm_model(w, 1, 0))
    x = random_array(rng, (1, 64))
    np.testing.assert_allclose(one_row.run(None, {"x": x})[0], x @ w, **sum_tol(256))
    assert _panels_used(one_row, {"x": x}) == ()
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    model = make_model(
        [node],
        [value_info("a", F32, (8, 64)), value_info("b", F32, (64, 48))],
        [value_info("y", F32, (8, 48))],
    )
    session = polyonnx.InferenceSession(model)
    feed = {"a": random_array(rng, (8, 64)), "b": w}
    np.testing.assert_allclose(session.run(None, feed)[0], feed["a"] @ w, **sum_tol(256))
    assert _panels_used(session, feed) == ()


def test_two_gemms_alike_but_for_their_weights_each_read_their_own():
    """Structurally identical kernels share one function; each passes its own copy."""
    rng = np.random.default_rng(1)
    w1, w2 = random_array(rng, (33, 40)), random_array(rng, (33, 40))
    nodes = [
        helper.make_node("Gemm", ["x", "w1"], ["y1"], name="fc1"),
        helper.make_node("Gemm", ["x", "w2"], ["y2"], name="fc2"),
    ]
    model = make_model(
        nodes,
        [value_info("x", F32, (9, 33))],
        [value_info("y1", F32, (9, 40)), value_info("y2", F32, (9, 40))],
        {"w1": w1, "w2": w2},
    )
    session = polyonnx.InferenceSession(model)
    x = random_array(rng, (9, 33))
    y1, y2 = session.run(None, {"x": x})
    np.testing.assert_allclose(y1, x @ w1, **sum_tol(132))
    np.testing.assert_allclose(y2, x @ w2, **sum_tol(132))
    compiled = session.compiled_for({"x": x})
    assert [s.panels[0][0] for s in compiled.schedules] == ["w1", "w2"]
    assert compiled.symbols[0] == compiled.symbols[1]


def test_the_tuner_does_not_search_packb_for_a_b_packed_once():
    """Either value of packb runs the same code there: trials would measure it twice."""
    program = lower_model(_gemm_model(np.ones((64, 48), F32), 8, 0))
    kernel = program.kernels[0]
    assert len(space_for(kernel, program.buffers, 1, 16).knobs["packb"]) == 2
    assert len(space_for(kernel, program.buffers, 1, 16, program).knobs["packb"]) == 1


def test_one_weight_read_two_ways_gets_a_copy_for_each():
    """x @ W and x @ W^T over the same constant: two layouts, two copies."""
    rng = np.random.default_rng(2)
    w = random_array(rng, (40, 40))
    nodes = [
        helper.make_node("Einsum", ["x", "w"], ["y1"], name="e1", equation="ik,kj->ij"),
        helper.make_node("Einsum", ["x", "w"], ["y2"], name="e2", equation="ik,jk->ij"),
    ]
    model = make_model(
        nodes,
        [value_info("x", F32, (6, 40))],
        [value_info("y1", F32, (6, 40)), value_info("y2", F32, (6, 40))],
        {"w": w},
    )
    session = polyonnx.InferenceSession(model)
    x = random_array(rng, (6, 40))
    y1, y2 = session.run(None, {"x": x})
    np.testing.assert_allclose(y1, x @ w, **sum_tol(160))
    np.testing.assert_allclose(y2, x @ w.T, **sum_tol(160))
    copies = [s.panels for s in session.compiled_for({"x": x}).schedules if s.panels]
    assert len({c[0][1] for c in copies}) == 2, copies


def test_a_default_short_gemm_reads_its_copy_in_default_blocks():
    """16 rows and a B of 9.4 MB: the default reads B in place ROWS_KC rows at a time;
    from its copy it takes the default K and N blocks (gemm_defaults.panel_blocks).
    Parameters other than the default's stay: a script's kc of 32."""
    from polyonnx.schedule.heuristics.default import default_schedule
    from polyonnx.schedule.heuristics.gemm_defaults import ROWS_KC

    w = np.zeros((768, 3072), F32)
    prog = polyonnx.load(_gemm_model(w, 16, 0))
    program, _ = prog.compilable()
    default = default_schedule(program.kernels[0], program.buffers)
    before = Params.from_mark(MARK.search(default.tree).group())
    assert before.kc == ROWS_KC and not before.packb
    _, (after,) = pack_constants(program, (default,))
    params = Params.from_mark(MARK.search(after.tree).group())
    assert after.panels and (params.kc, params.nc) == (768, 512)
    assert {m for ms in after.state.marks.values() for m in ms} >= {params.mark()}
    prog.schedule("fc").ukernel(kc=32)
    _, (scripted,) = pack_constants(*prog.compilable())
    assert Params.from_mark(MARK.search(scripted.tree).group()).kc == 32
