"""Trace replay through the one registry of primitives, and pack's legality commit."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyonnx as po
from polyonnx.errors import ScheduleError
from polyonnx.schedule.schedule import REPLAY, Schedule


def _matmul():
    def f(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    node = helper.make_node("MatMul", ["x", "b"], ["y"], name="k")
    graph = helper.make_graph([node], "g", [f("x", [16, 8]), f("b", [8, 24])], [f("y", [16, 24])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_every_primitive_replays_under_its_own_name():
    for name, replay in REPLAY.items():
        assert replay.method is getattr(Schedule, name)
        if replay.spread is not None:
            assert replay.spread in inspect.signature(replay.method).parameters or (
                replay.spread == "params"
            )


def test_a_trace_replays_to_the_same_loop_nest():
    prog = po.load(_matmul())
    s = prog.schedule("k")
    io, ii = s.split("i", 4)
    s.tile("j", "k", sizes=(8, 4))
    s.reorder("j_o", io)
    s.unroll("k_i")
    s.pack("b", at="j_o")
    s.parallel(ii)
    again = Schedule(s.kernel, s.buffers)
    again.apply(s.trace)
    assert str(again) == str(s) and again.trace == s.trace


def test_an_unknown_primitive_names_the_known_ones():
    s = po.load(_matmul()).schedule("k")
    with pytest.raises(ScheduleError, match=r"unknown primitive 'swizzle'.*split, tile"):
        s.apply([{"kernel": "k", "primitive": "swizzle", "args": {}}])


def test_pack_inside_a_parallel_loop_is_refused_its_threads_would_share_the_scratch():
    """Before the legality commit, this pack was accepted and every run raced: the threads
    of i each copied their column of b into the one b.pack0."""
    s = po.load(_matmul()).schedule("k")
    s.parallel("i")
    before = str(s)
    with pytest.raises(ScheduleError, match=r"threads of parallel loop i share .* outside i"):
        s.pack("b", at="j")
    assert str(s) == before and [t["primitive"] for t in s.trace] == ["parallel"]


def test_pack_outside_the_parallel_loop_is_exact():
    model = _matmul()
    prog = po.load(model)
    s = prog.schedule("k")
    s.reorder("j", "i")
    s.parallel("i")
    s.pack("b", at="j")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 24)).astype(np.float32)
    (got,) = po.InferenceSession(prog, threads=2).run(None, {"x": x, "b": b})
    np.testing.assert_allclose(got, x @ b, rtol=1e-5, atol=1e-5)


def test_a_parallel_loop_after_pack_inside_it_is_refused():
    s = po.load(_matmul()).schedule("k")
    s.pack("b", at="j")
    with pytest.raises(ScheduleError, match=r"parallel\(i\): i carries a dependence"):
        s.parallel("i")


def test_pack_inside_a_vectorized_loop_is_refused_the_loop_would_not_be_innermost():
    s = po.load(_matmul()).schedule("k")
    s.reorder("k", "j")
    s.vectorize("j")
    with pytest.raises(ScheduleError, match=r"vectorized loop j illegal.*not the innermost"):
        s.pack("b", at="j")
    s.pack("b", at="i")
