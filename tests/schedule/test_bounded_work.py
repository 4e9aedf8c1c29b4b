"""Compile work stays polynomial in a tensor's rank and in the number of schedule steps
(issue 40): a Relu over [2]*10 never finished compiling (its one coalesced loop made isl
invert a ten-digit mixed-radix number), and 200 nested splits doubled the loop
expressions with each split."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyonnx as po
from polyonnx.errors import CodegenError, ScheduleError
from polyonnx.krnl.ir import Access, Buffer, Const, Statement
from polyonnx.schedule.astgen import _check_index_range, build_ast
from polyonnx.schedule.heuristics import nest
from polyonnx.schedule.state import MAX_LOOPS


def _info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(op, shapes, out, **attrs):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node(op, names, ["y"], name="k", **attrs)
    inputs = [_info(n, s) for n, s in zip(names, shapes, strict=True)]
    graph = helper.make_graph([node], "g", inputs, [_info("y", out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _ast_size(model) -> int:
    """Characters of the isl ASTs of the model's kernels under the default schedules."""
    lowered, schedules = po.load(model).compilable()
    return sum(len(build_ast(k, lowered.buffers).root.to_C_str()) for k in schedules)


@pytest.mark.parametrize("rank", [2, 4, 6, 8, 10, 12])
def test_the_ast_grows_linearly_with_rank(rank):
    """Coalescing every dim, the Relu's AST had 1,940 characters at rank 6 and 4,778 at
    rank 7 (case splits of % and / rebuilding each dim of 2 from the one loop), and
    never finished at rank 10; capped, it grows by some 55 a dim."""
    limit = 120 * rank + 200
    assert _ast_size(_model("Relu", [[2] * rank], [2] * rank)) < limit
    assert _ast_size(_model("Relu", [[3] * rank], [3] * rank)) < limit
    assert _ast_size(_model("Softmax", [[2] * rank], [2] * rank, axis=-1)) < 4 * limit


def test_at_most_max_coalesced_wide_dims_share_a_loop():
    model = _model("Relu", [[2] * 10], [2] * 10)
    lowered = po.load(model).lowered
    (stmt,) = lowered.kernels[0].statements
    plan = nest.loop_nest(stmt, lowered.buffers)
    assert len(plan.order) == 10 - nest.MAX_COALESCED + 1
    assert plan.order[-1].count("*") == nest.MAX_COALESCED - 1


@pytest.mark.parametrize(
    ("op", "shapes", "out"),
    [
        ("Relu", [[2] * 10], [2] * 10),
        ("Relu", [[2] * 16], [2] * 16),
        ("Relu", [[3] * 9], [3] * 9),
        ("Relu", [[1] * 20], [1] * 20),
        ("Relu", [[2, 3] * 5], [2, 3] * 5),
        ("Add", [[2] * 12, [1, 2] * 6], [2] * 12),
        ("Add", [[2] * 10, [2, 1] * 5], [2] * 10),
        ("Mul", [[3] * 8, [3]], [3] * 8),
    ],
)
def test_high_rank_kernels_compile_and_agree_with_numpy(op, shapes, out):
    rng = np.random.default_rng(len(out))
    feed = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    session = po.InferenceSession(_model(op, shapes, out), tuning_db=False)
    (got,) = session.run(None, feed)
    values = list(feed.values())
    want = {"Relu": lambda: np.maximum(values[0], 0)}.get(op) or (
        lambda: np.add(*values) if op == "Add" else np.multiply(*values)
    )
    np.testing.assert_allclose(got, want(), rtol=1e-6)


def _relu_schedule():
    return po.load(_model("Relu", [[4, 8]], [4, 8]))


@pytest.mark.parametrize("keep", ["inner", "outer"])
def test_nested_splits_grow_the_loops_linearly_and_stop_at_max_loops(keep):
    prog = _relu_schedule()
    s = prog.schedule("k")
    loop, done, refused = s.loops[-1], 0, []
    for _ in range(200):
        try:
            outer, inner = s.split(loop, 1)
        except ScheduleError as error:
            refused.append(str(error))
            continue
        done += 1
        loop = inner if keep == "inner" else outer
    assert done == MAX_LOOPS - 2 and len(refused) == 200 - done
    assert f"at most {MAX_LOOPS}" in refused[0]
    longest = max(len(v.expr) for n in s.state.nests for v in n.loops)
    assert longest < 20 * MAX_LOOPS  # doubling, it was 2**30 characters
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    (got,) = po.InferenceSession(prog, threads=1).run(None, {"x0": x})
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_a_split_of_a_split_loop_is_exact():
    prog = _relu_schedule()
    s = prog.schedule("k")
    _, inner = s.split("d1", 3)
    s.split(inner, 2)
    s.split("d0", 3)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    (got,) = po.InferenceSession(prog, threads=1).run(None, {"x0": x})
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_a_loop_bound_past_64_bits_is_refused_naming_the_kernel():
    """A buffer of few elements read at an index beyond 2**63 (a huge pad's offset)."""
    big = 2**64
    stmt = Statement(
        "S0",
        f"{{ S0[i] : {big} <= i < {big} + 4 }}",
        Access("y", f"{{ S0[i] -> [i - {big}] }}"),
        Const("float32", 0.0),
    )
    buffers = {"y": Buffer("y", (4,), "float32")}
    with pytest.raises(CodegenError, match=r"kernel 'pad': loop i of S0 reaches 1844\d+"):
        _check_index_range("pad", [stmt], buffers)
    fits = Statement("S0", "{ S0[i] : 0 <= i < 4 }", Access("y", "{ S0[i] -> [i] }"), stmt.expr)
    _check_index_range("pad", [fits], buffers)
