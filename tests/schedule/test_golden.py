"""Golden tests: what each schedule primitive does to a loop nest, shown as pseudo-C.

This file is a readable catalogue of the primitives of the schedule API (``split``,
``tile``, ``reorder``, ``pack``, ``vectorize``, ``unroll``, ``parallel``, ``compute_at``).
Each test builds a tiny model, prints the kernel's loop nest (``str(schedule)``) before and
after one primitive, and compares both with the text written out below, in the spirit of
xDSL's filecheck tests and TVM's structural-equality tests. Extents are small and odd (5 x 7,
factors of 2 and 3) so that the guards of a remainder show. Each test also runs the
scheduled program and checks its answer against numpy, so every printout below is a loop
nest that computes the right thing.

Read ``docs/schedule.md`` for the preconditions of each primitive; the random-script tests
in ``test_schedule.py`` check the numbers for many more schedules.

If a change to the code generator or the printer changes a printout, update the text here
after reading the new loop nest: the diff is the point of these tests.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyonnx as po


def _f(name: str, shape: list[int]):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "golden", inputs, outputs)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


# y = x + b: x [5, 7], b [7] broadcast along the rows. One kernel "add", loops d0, d1.
ADD = _model(
    [helper.make_node("Add", ["x", "b"], ["y"], name="add")],
    [_f("x", [5, 7]), _f("b", [7])],
    [_f("y", [5, 7])],
)

# y = x @ w: x [5, 4], w [4, 7]. One kernel "mm", loops i, j, k (k is the reduction).
MM = _model(
    [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
    [_f("x", [5, 4]), _f("w", [4, 7])],
    [_f("y", [5, 7])],
)

# t = x @ w; y = Relu(t): two consecutive kernels "mm" and "relu".
MM_RELU = _model(
    [
        helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
        helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ],
    [_f("x", [5, 4]), _f("w", [4, 7])],
    [_f("y", [5, 7])],
)

RNG = np.random.default_rng(0)
X57 = RNG.standard_normal((5, 7)).astype(np.float32)
B7 = RNG.standard_normal(7).astype(np.float32)
X54 = RNG.standard_normal((5, 4)).astype(np.float32)
W47 = RNG.standard_normal((4, 7)).astype(np.float32)

ADD_NEST = """
    for (int d0 = 0; d0 <= 4; d0++)
      for (int d1 = 0; d1 <= 6; d1++)
        y[d0][d1] = (x[d0][d1] + b[d1]);
"""

MM_NEST = """
    for (int i = 0; i <= 4; i++)
      for (int j = 0; j <= 6; j++)
        y[i][j] = 0.0;
    for (int i = 0; i <= 4; i++)
      for (int j = 0; j <= 6; j++)
        for (int k = 0; k <= 3; k++)
          y[i][j] += (x[i][k] * w[k][j]);
"""


def nest(text: str) -> str:
    """The expected loop nest: ``text`` without its common indentation and outer blank lines."""
    return textwrap.dedent(text).strip("\n")


def run(prog: po.Program, **feed: np.ndarray) -> np.ndarray:
    """Compile the program with its schedules and run it: its one output."""
    (y,) = po.InferenceSession(prog).run(None, feed)
    return y


def add_schedule() -> tuple[po.Program, po.Schedule]:
    prog = po.load(ADD)
    s = prog.schedule("add")
    assert str(s) == nest(ADD_NEST)
    return prog, s


def mm_schedule() -> tuple[po.Program, po.Schedule]:
    prog = po.load(MM)
    s = prog.schedule("mm")
    assert str(s) == nest(MM_NEST)
    return prog, s


def test_split_cuts_a_loop_in_two_with_a_guard_on_the_last_block():
    """split(d1, 3): d1 = 3 * d1_o + d1_i. 7 is not a multiple of 3, so the last block
    (d1_o = 2) runs one iteration: the inner bound is min(2, 6 - 3 * d1_o)."""
    prog, s = add_schedule()  # before: ADD_NEST
    assert s.split("d1", 3) == (po.Loop("d1_o"), po.Loop("d1_i"))
    assert str(s) == nest("""
        for (int d0 = 0; d0 <= 4; d0++)
          for (int d1_o = 0; d1_o <= 2; d1_o++)
            for (int d1_i = 0; d1_i <= min(2, ((-3 * d1_o) + 6)); d1_i++)
              y[d0][(3 * d1_o) + d1_i] = (x[d0][(3 * d1_o) + d1_i] + b[(3 * d1_o) + d1_i]);
    """)
    np.testing.assert_allclose(run(prog, x=X57, b=B7), X57 + B7, rtol=1e-6)


def test_tile_splits_every_loop_and_puts_the_outer_loops_first():
    """tile(d0, d1, sizes=(2, 3)) is split(d0, 2), split(d1, 3), reorder(d0_o, d1_o, d0_i,
    d1_i): the nest walks 2 x 3 blocks, and both inner loops have a guard."""
    prog, s = add_schedule()  # before: ADD_NEST
    assert s.tile("d0", "d1", sizes=(2, 3)) == tuple(
        po.Loop(n) for n in ("d0_o", "d1_o", "d0_i", "d1_i")
    )
    assert str(s) == nest("""
        for (int d0_o = 0; d0_o <= 2; d0_o++)
          for (int d1_o = 0; d1_o <= 2; d1_o++)
            for (int d0_i = 0; d0_i <= min(1, ((-2 * d0_o) + 4)); d0_i++)
              for (int d1_i = 0; d1_i <= min(2, ((-3 * d1_o) + 6)); d1_i++)
                y[(2 * d0_o) + d0_i][(3 * d1_o) + d1_i] = (x[(2 * d0_o) + d0_i][(3 * d1_o) + d1_i] + b[(3 * d1_o) + d1_i]);
    """)  # noqa: E501
    np.testing.assert_allclose(run(prog, x=X57, b=B7), X57 + B7, rtol=1e-6)


def test_reorder_interchanges_loops_in_every_statement_that_has_them():
    """reorder(k, j): the reduction k moves outside j in S1 (w[k][j] is then read along
    its rows); S0, the init, has no k and keeps its order."""
    prog, s = mm_schedule()  # before: MM_NEST
    s.reorder("k", "j")
    assert str(s) == nest("""
        for (int i = 0; i <= 4; i++)
          for (int j = 0; j <= 6; j++)
            y[i][j] = 0.0;
        for (int i = 0; i <= 4; i++)
          for (int k = 0; k <= 3; k++)
            for (int j = 0; j <= 6; j++)
              y[i][j] += (x[i][k] * w[k][j]);
    """)
    np.testing.assert_allclose(run(prog, x=X54, w=W47), X54 @ W47, rtol=1e-5, atol=1e-5)


def test_pack_copies_the_tile_an_iteration_reads_into_a_scratch_buffer():
    """pack(w, at=j_o): once per iteration of j_o, the 4 x 3 block of w that the loops
    inside j_o read is copied to w.pack0 (the last block is 4 x 1: the copy has the same
    guard as j_i), and S1 reads w.pack0[k][j_i] instead of w[k][3 * j_o + j_i]."""
    prog, s = mm_schedule()  # before: MM_NEST
    jo, ji = s.split("j", 3)
    s.reorder(jo, "i", "k", ji)
    assert str(s) == nest("""
        for (int j_o = 0; j_o <= 2; j_o++)
          for (int i = 0; i <= 4; i++)
            for (int j_i = 0; j_i <= min(2, ((-3 * j_o) + 6)); j_i++)
              y[i][(3 * j_o) + j_i] = 0.0;
        for (int j_o = 0; j_o <= 2; j_o++)
          for (int i = 0; i <= 4; i++)
            for (int k = 0; k <= 3; k++)
              for (int j_i = 0; j_i <= min(2, ((-3 * j_o) + 6)); j_i++)
                y[i][(3 * j_o) + j_i] += (x[i][k] * w[k][(3 * j_o) + j_i]);
    """)
    s.pack("w", at=jo)
    assert str(s) == nest("""
        for (int j_o = 0; j_o <= 2; j_o++)
          for (int i = 0; i <= 4; i++)
            for (int j_i = 0; j_i <= min(2, ((-3 * j_o) + 6)); j_i++)
              y[i][(3 * j_o) + j_i] = 0.0;
        for (int j_o = 0; j_o <= 2; j_o++)
          for (int P_w_t0 = 0; P_w_t0 <= 3; P_w_t0++)
            for (int P_w_t1 = 0; P_w_t1 <= min(2, ((-3 * j_o) + 6)); P_w_t1++)
              w.pack0[P_w_t0][P_w_t1] = w[P_w_t0][(3 * j_o) + P_w_t1];
          for (int i = 0; i <= 4; i++)
            for (int k = 0; k <= 3; k++)
              for (int j_i = 0; j_i <= min(2, ((-3 * j_o) + 6)); j_i++)
                y[i][(3 * j_o) + j_i] += (x[i][k] * w.pack0[k][j_i]);
    """)
    np.testing.assert_allclose(run(prog, x=X54, w=W47), X54 @ W47, rtol=1e-5, atol=1e-5)


def test_vectorize_marks_the_innermost_loop():
    """vectorize(d1) only adds a mark: the loop nest is the same, and the code generator
    emits d1 as SIMD code with a scalar tail (7 is not a multiple of the lanes)."""
    prog, s = add_schedule()  # before: ADD_NEST
    s.vectorize("d1")
    assert str(s) == nest("""
        for (int d0 = 0; d0 <= 4; d0++)
          #pragma vectorize
          for (int d1 = 0; d1 <= 6; d1++)
            y[d0][d1] = (x[d0][d1] + b[d1]);
    """)
    np.testing.assert_allclose(run(prog, x=X57, b=B7), X57 + B7, rtol=1e-6)


def test_unroll_by_a_factor_splits_then_copies_the_body():
    """unroll(d1, 3) is split(d1, 3) with d1_i unrolled: three copies of the body per
    iteration of d1_o. The last block (d1_o = 2, d1 = 6) has one iteration, so the second
    and third copies are guarded."""
    prog, s = add_schedule()  # before: ADD_NEST
    s.unroll("d1", 3)
    assert str(s) == nest("""
        for (int d0 = 0; d0 <= 4; d0++)
          for (int d1_o = 0; d1_o <= 2; d1_o++)
            y[d0][3 * d1_o] = (x[d0][3 * d1_o] + b[3 * d1_o]);
            if (d1_o <= 1) {
              y[d0][(3 * d1_o) + 1] = (x[d0][(3 * d1_o) + 1] + b[(3 * d1_o) + 1]);
              y[d0][(3 * d1_o) + 2] = (x[d0][(3 * d1_o) + 2] + b[(3 * d1_o) + 2]);
            }
    """)
    np.testing.assert_allclose(run(prog, x=X57, b=B7), X57 + B7, rtol=1e-6)


def test_unroll_without_a_factor_unrolls_completely():
    """unroll(d0): one copy of the inner loop per value of d0 (at most 64 iterations)."""
    prog, s = add_schedule()  # before: ADD_NEST
    s.unroll("d0")
    assert str(s) == nest("""
        for (int d1 = 0; d1 <= 6; d1++)
          y[0][d1] = (x[0][d1] + b[d1]);
        for (int d1 = 0; d1 <= 6; d1++)
          y[1][d1] = (x[1][d1] + b[d1]);
        for (int d1 = 0; d1 <= 6; d1++)
          y[2][d1] = (x[2][d1] + b[d1]);
        for (int d1 = 0; d1 <= 6; d1++)
          y[3][d1] = (x[3][d1] + b[d1]);
        for (int d1 = 0; d1 <= 6; d1++)
          y[4][d1] = (x[4][d1] + b[d1]);
    """)
    np.testing.assert_allclose(run(prog, x=X57, b=B7), X57 + B7, rtol=1e-6)


def test_parallel_marks_a_loop_to_run_on_threads():
    """parallel(d0) only adds a mark: the rows are cut into one chunk per thread."""
    prog, s = add_schedule()  # before: ADD_NEST
    s.parallel("d0")
    assert str(s) == nest("""
        #pragma parallel
        for (int d0 = 0; d0 <= 4; d0++)
          for (int d1 = 0; d1 <= 6; d1++)
            y[d0][d1] = (x[d0][d1] + b[d1]);
    """)
    np.testing.assert_allclose(run(prog, x=X57, b=B7), X57 + B7, rtol=1e-6)


def test_a_refused_step_says_why_and_leaves_the_nest_as_it_was():
    """parallel(k) would let threads race on the sums of y[i][j]: refused, nothing changes."""
    prog, s = mm_schedule()  # before: MM_NEST
    with pytest.raises(po.ScheduleError) as err:
        s.parallel("k")
    assert str(err.value) == (
        "parallel(k): k carries a reduction in S1 (S1[i=0, j=0, k=0] before S1[i=0, j=0, k=1]): "
        "parallelise i or j, or split k and reduce the partial sums"
    )
    assert str(s) == nest(MM_NEST)
    np.testing.assert_allclose(run(prog, x=X54, w=W47), X54 @ W47, rtol=1e-5, atol=1e-5)


def test_compute_at_fuses_a_consumer_into_its_producers_loop():
    """compute_at(relu, j) over the two kernels mm and relu: Relu's loops d0, d1 become
    mm's i, j, and y[i][j] is computed right after the k loop has finished t[i][j]."""
    prog = po.load(MM_RELU)
    g = prog.schedule("mm", "relu")
    assert str(g) == nest("""
        for (int i = 0; i <= 4; i++)
          for (int j = 0; j <= 6; j++)
            t[i][j] = 0.0;
        for (int i = 0; i <= 4; i++)
          for (int j = 0; j <= 6; j++)
            for (int k = 0; k <= 3; k++)
              t[i][j] += (x[i][k] * w[k][j]);
        for (int d0 = 0; d0 <= 4; d0++)
          for (int d1 = 0; d1 <= 6; d1++)
            y[d0][d1] = max(t[d0][d1], 0.0);
    """)
    g.compute_at("relu", "j")
    assert str(g) == nest("""
        for (int i = 0; i <= 4; i++)
          for (int j = 0; j <= 6; j++)
            t[i][j] = 0.0;
        for (int i = 0; i <= 4; i++)
          for (int j = 0; j <= 6; j++)
            for (int k = 0; k <= 3; k++)
              t[i][j] += (x[i][k] * w[k][j]);
            y[i][j] = max(t[i][j], 0.0);
    """)
    np.testing.assert_allclose(
        run(prog, x=X54, w=W47), np.maximum(X54 @ W47, 0), rtol=1e-5, atol=1e-5
    )
