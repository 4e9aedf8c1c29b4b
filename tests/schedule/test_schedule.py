"""The schedule scripting API: random sequences of primitives are either refused with a
ScheduleError or compile to a kernel whose output equals the default schedule's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import polyonnx as po
from polyonnx.errors import ScheduleError
from tests.helpers import fast

FACTORS = [1, 2, 3, 5, 7, 16, 32]


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _cases():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    return {
        "matmul": (_model([helper.make_node("MatMul", ["x", "b"], ["y"], name="k")],
                          [_f("x", [13, 11]), _f("b", [11, 17])], [_f("y", [13, 17])]),
                   {"x": (13, 11), "b": (11, 17)}),
        "conv": (_model([helper.make_node("Conv", ["x", "w"], ["y"], name="k", pads=[1, 1, 1, 1])],
                        [_f("x", [1, 2, 7, 9])], [_f("y", [1, 3, 7, 9])], [w]),
                 {"x": (1, 2, 7, 9)}),
        "softmax": (_model([helper.make_node("Softmax", ["x"], ["y"], name="k")],
                           [_f("x", [6, 19])], [_f("y", [6, 19])]),
                    {"x": (6, 19)}),
        "reduce": (_model([helper.make_node("ReduceMax", ["x"], ["y"], name="k", axes=[1],
                                            keepdims=0)],
                          [_f("x", [9, 23])], [_f("y", [9])]),
                   {"x": (9, 23)}),
        "elementwise": (_model([helper.make_node("Add", ["x", "z"], ["y"], name="k")],
                               [_f("x", [5, 37]), _f("z", [37])], [_f("y", [5, 37])]),
                        {"x": (5, 37), "z": (37,)}),
    }  # fmt: skip


CASES = _cases()


@st.composite
def steps(draw, max_steps=5):
    return [
        (draw(st.sampled_from(["split", "reorder", "vectorize", "unroll", "tile", "parallel",
                               "pack"])),
         draw(st.integers(0, 10**6)), draw(st.sampled_from(FACTORS)))
        for _ in range(draw(st.integers(1, max_steps)))
    ]  # fmt: skip


def _apply(s: po.Schedule, primitive: str, pick: int, factor: int) -> None:
    loops = list(s.state.loop_names())
    loop = loops[pick % len(loops)]
    if primitive == "split":
        s.split(loop, factor)
    elif primitive == "reorder":
        order = list(loops)
        np.random.default_rng(pick).shuffle(order)
        s.reorder(*order[: 2 + pick % max(len(order) - 1, 1)])
    elif primitive == "vectorize":
        s.vectorize(loop)
    elif primitive == "parallel":
        s.parallel(loop)
    elif primitive == "pack":
        inputs = sorted(s.kernel.reads() - s.kernel.writes())
        s.pack(inputs[pick % len(inputs)], at=loop)
    elif primitive == "unroll":
        s.unroll(loop, factor if pick % 2 else None)
    else:
        other = loops[(pick // 7) % len(loops)]
        if other != loop:
            s.tile(loop, other, sizes=(factor, FACTORS[pick % len(FACTORS)]))


@pytest.mark.parametrize("case", sorted(CASES))
@fast(12)
@given(script=steps())
def test_random_schedules_are_refused_or_exact(case, script):
    model, shapes = CASES[case]
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    (want,) = po.InferenceSession(model).run(None, feed)
    prog = po.load(model)
    s = prog.schedule("k")
    for primitive, pick, factor in script:
        before = str(s)
        try:
            _apply(s, primitive, pick, factor)
        except ScheduleError:
            assert str(s) == before  # a refused step leaves the schedule unchanged
    (got,) = po.InferenceSession(prog).run(None, feed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_parallel_loop_of_one_iteration_does_not_thread_the_loop_below_it():
    """Found by the test above: tiling n (extent 1) leaves a loop n_i of one iteration right
    above the reduction loop k0; isl emits no loop for n_i, so its parallel mark sat on k0,
    and two threads raced on the sums. A mark on a loop of one value is now left out."""
    model, shapes = CASES["conv"]
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    (want,) = po.InferenceSession(model).run(None, feed)
    prog = po.load(model)
    s = prog.schedule("k")
    _apply(s, "tile", 239124, 1)
    _apply(s, "parallel", 1, 2)
    assert s.state.marked("n_i", "parallel")
    session = po.InferenceSession(prog, threads=2)
    for _ in range(20):  # a race shows in some runs only
        (got,) = session.run(None, feed)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _odd_matmul():
    rng = np.random.default_rng(2)
    b = rng.standard_normal((61, 83)).astype(np.float32)
    model = _model(
        [helper.make_node("MatMul", ["x", "b"], ["y"], name="mm")],
        [_f("x", [97, 61])], [_f("y", [97, 83])], [numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    x = rng.standard_normal((97, 61)).astype(np.float32)
    return model, x, x @ b


def test_odd_matmul_split_reorder_vectorize_unroll_and_replay():
    model, x, want = _odd_matmul()
    prog = po.load(model)
    s = prog.schedule("mm")
    i, j, k = s.loops
    assert [loop.name for loop in s.loops] == ["i", "j", "k"]
    io, ii = s.split(i, 8)
    jo, ji = s.split(j, 32)
    s.reorder(io, jo, k, ii, ji)
    s.vectorize(ji)
    s.unroll(ii, 4)
    (got,) = po.InferenceSession(prog).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fresh = po.load(model)
    fresh.apply(prog.trace)
    assert str(fresh.schedule("mm")) == str(s)
    (again,) = po.InferenceSession(fresh).run(None, {"x": x})
    np.testing.assert_array_equal(again, got)


def test_default_starts_from_the_heuristic_and_later_steps_refine_it():
    model, x, want = _odd_matmul()
    prog = po.load(model)
    s = prog.schedule("mm")
    s.default()
    assert "ukernel" in str(s)  # the default of a GEMM: the packed micro-kernel
    (got,) = po.InferenceSession(prog).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fresh = po.load(model)
    fresh.apply(prog.trace)
    assert prog.trace == [{"kernel": "mm", "primitive": "default", "args": {}}]
    assert str(fresh.schedule("mm")) == str(s)


def test_parallel_on_the_reduction_loop_is_refused_with_a_reason():
    model, _, _ = _odd_matmul()
    s = po.load(model).schedule("mm")
    _, _, k = s.loops
    before = str(s)
    with pytest.raises(ScheduleError) as err:
        s.parallel(k)
    message = str(err.value)
    assert "k carries a reduction" in message
    assert "S1[i=0, j=0, k=0] before S1[i=0, j=0, k=1]" in message
    assert "parallelise i or j" in message and "split k" in message
    assert str(s) == before and s.trace == []


def test_vectorize_needs_the_innermost_loop():
    model, _, _ = _odd_matmul()
    s = po.load(model).schedule("mm")
    with pytest.raises(ScheduleError, match="not the innermost loop"):
        s.vectorize("i")


def test_unknown_loops_and_bad_factors_are_refused():
    model, _, _ = _odd_matmul()
    s = po.load(model).schedule("mm")
    with pytest.raises(ScheduleError, match="no loop 'q'; its loops are i, j, k"):
        s.split("q", 4)
    with pytest.raises(ScheduleError, match="positive int"):
        s.split("i", 0)
    with pytest.raises(ScheduleError, match="limited to 64"):
        s.unroll("i")


def test_schedule_of_unknown_kernel_lists_kernels():
    model, _, _ = _odd_matmul()
    with pytest.raises(ScheduleError, match="no kernel named 'nope'; kernels are: mm"):
        po.load(model).schedule("nope")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_loops_run_on_threads_in_the_generated_code(threads):
    model, x, want = _odd_matmul()
    prog = po.load(model)
    s = prog.schedule("mm")
    i, j, k = s.loops
    io, ii = s.split(i, 16)
    s.reorder(io, ii, k, j)
    s.vectorize(j)
    s.parallel(io)
    assert "#pragma parallel\nfor (int i_o" in str(s)
    session = po.InferenceSession(prog, threads=threads)
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    compiled = session.compiled_for(session.validate({"x": x}))
    assert "polyonnx_pool_run" in compiled.jit.optimized
    assert any(
        ".par" in line for line in compiled.jit.source.splitlines() if line.startswith("define")
    )


def test_nested_parallel_loops_are_refused():
    model, _, _ = _odd_matmul()
    s = po.load(model).schedule("mm")
    i, j, _ = s.loops
    s.parallel(i)
    with pytest.raises(ScheduleError, match="already runs i in parallel"):
        s.parallel(j)


def _mm_bias_relu():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((61, 83)).astype(np.float32)
    b = rng.standard_normal(83).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
        helper.make_node("Add", ["t", "b"], ["u"], name="bias"),
        helper.make_node("Relu", ["u"], ["y"], name="relu"),
    ]
    model = _model(nodes, [_f("x", [97, 61])], [_f("y", [97, 83])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])  # fmt: skip
    x = rng.standard_normal((97, 61)).astype(np.float32)
    return model, x, np.maximum(x @ w + b, 0)


def test_fusing_add_and_relu_into_the_matmul_leaves_no_intermediate_buffer():
    model, x, want = _mm_bias_relu()
    prog = po.load(model)
    g = prog.schedule("mm", "bias", "relu")
    _, j, _ = g.loops
    g.compute_at("bias", j)
    g.compute_at("relu", j)
    text = str(g)
    assert "      t[i][j] += (x[i][k] * w[k][j]);\n    u[i][j] = (t[i][j] + b[j]);" in text
    lowered, _ = prog.compilable()
    assert [k.name for k in lowered.kernels] == ["mm+bias+relu"]
    assert "u" not in lowered.buffers  # the Add's output never exists
    assert not any(s.write.buffer == "u" for s in lowered.kernels[0].statements)
    (got,) = po.InferenceSession(prog).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fresh = po.load(model)
    fresh.apply(prog.trace)
    (again,) = po.InferenceSession(fresh).run(None, {"x": x})
    np.testing.assert_array_equal(again, got)


def _two_layers():
    """x -> MatMul mm1 -> Add bias1 -> Relu relu1 -> MatMul mm2 -> Add bias2 -> Relu relu2."""
    rng = np.random.default_rng(5)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((23, 37), (37, 29)))
    b1, b2 = (rng.standard_normal(n).astype(np.float32) for n in (37, 29))
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["t1"], name="mm1"),
        helper.make_node("Add", ["t1", "b1"], ["u1"], name="bias1"),
        helper.make_node("Relu", ["u1"], ["h"], name="relu1"),
        helper.make_node("MatMul", ["h", "w2"], ["t2"], name="mm2"),
        helper.make_node("Add", ["t2", "b2"], ["u2"], name="bias2"),
        helper.make_node("Relu", ["u2"], ["y"], name="relu2"),
    ]
    inits = [
        numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"), (b2, "b2"))
    ]
    model = _model(nodes, [_f("x", [19, 23])], [_f("y", [19, 29])], inits)
    x = rng.standard_normal((19, 23)).astype(np.float32)
    return model, x, np.maximum(np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0)


def _kernels(prog):
    return [(k.name, len(k.statements)) for k in prog.compilable()[0].kernels]


def test_a_program_without_a_script_compiles_as_the_model_does():
    model, x, want = _two_layers()
    prog = po.load(model)
    lowered, schedules = prog.compilable()
    default = po.InferenceSession(model).compiled_for({"x": x})
    assert [k.name for k in lowered.kernels] == [k.name for k in default.program.kernels]
    assert _kernels(prog) == [("mm1", 3), ("mm2", 3)]  # Add and Relu: one epilogue
    assert [s.tree for s in schedules] == [s.tree for s in default.schedules]
    (got,) = po.InferenceSession(prog).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_kernels_nobody_scripted_keep_their_fusion():
    model, x, want = _two_layers()
    prog = po.load(model)
    prog.schedule("mm1").ukernel(mr=4, nr=16)
    # mm1 runs its script alone; its Add and Relu still fuse as a chain, mm2 keeps both
    assert _kernels(prog) == [("mm1", 2), ("relu1", 1), ("mm2", 3)]
    (got,) = po.InferenceSession(prog).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    prog = po.load(model)
    s = prog.schedule("relu2")
    s.vectorize(s.loops[-1])
    # a scripted consumer is not absorbed: mm2 takes its Add, and stops at the Relu
    assert _kernels(prog) == [("mm1", 3), ("mm2", 3), ("relu2", 1)]
    (got,) = po.InferenceSession(prog).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_fusing_softmax_division_into_its_own_sum_loop_is_refused():
    model = _model([helper.make_node("Softmax", ["x"], ["y"], name="sm")],
                   [_f("x", [4, 9])], [_f("y", [4, 9])])  # fmt: skip
    s = po.load(model).schedule("sm")
    before = str(s)
    with pytest.raises(ScheduleError, match=r"S5 needs several iterations of r1 at once"):
        s.compute_at("S5", "r1")  # S5 divides by the sum S4 is still accumulating
    assert str(s) == before


def test_fused_kernels_must_be_consecutive():
    model, _, _ = _mm_bias_relu()
    with pytest.raises(ScheduleError, match="one after another"):
        po.load(model).schedule("mm", "relu")


def test_pack_copies_a_tile_per_iteration_and_replays():
    model, x, want = _odd_matmul()
    prog = po.load(model)
    s = prog.schedule("mm")
    i, j, k = s.loops
    jo, ji = s.split(j, 32)
    io, ii = s.split(i, 8)
    s.reorder(jo, io, k, ii, ji)
    s.pack("b", at=jo)
    s.vectorize(ji)
    text = str(s)
    assert "b.pack0[P_b_t0][P_b_t1] = b[P_b_t0][(32 * j_o) + P_b_t1];" in text
    assert "* b.pack0[k][j_i]);" in text
    lowered, _ = prog.compilable()
    assert lowered.buffers["b.pack0"].shape == (61, 32)
    (got,) = po.InferenceSession(prog).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fresh = po.load(model)
    fresh.apply(prog.trace)
    assert str(fresh.schedule("mm")) == text


def test_pack_refuses_buffers_the_kernel_writes_and_unknown_ones():
    model, _, _ = _odd_matmul()
    s = po.load(model).schedule("mm")
    _, j, _ = s.loops
    with pytest.raises(ScheduleError, match="exactly one statement under j must read 'y'"):
        s.pack("y", at=j)
    with pytest.raises(ScheduleError, match="has no buffer 'q'"):
        s.pack("q", at=j)
