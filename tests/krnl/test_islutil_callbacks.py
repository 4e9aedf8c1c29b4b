"""No Python exception crosses an isl callback (krnl/islutil.py ``isl_callbacks``): islpy
swallows one and isl carries on with an error value, on which an AST build segfaulted."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import islpy as isl
import pytest

from polyonnx.errors import ScheduleError
from polyonnx.krnl.islutil import isl_callbacks, tuple_names, visit

PACKAGE = Path(__file__).resolve().parents[2] / "polyonnx"
CALLBACK_METHODS = ("foreach_", "every_", "map_descendant", "set_at_each_domain", "set_before_")
"""isl methods that take a Python function (foreach_*, every_*, AST build hooks, ...)."""
GUARDED = ("each", "descend", "node", "wrap")
"""The CallbackGuard methods that make a callback safe."""


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_error_in_at_each_domain_is_raised_not_a_segfault():
    """Before the guard, islpy printed "exception in call back, ignoring" and isl crashed
    (SIGSEGV) on the node the callback failed to return."""
    done = _run(
        """
        import numpy as np
        from onnx import TensorProto, helper
        import polyonnx as po
        import polyonnx.schedule.astgen as astgen

        def broken(*args):
            raise ValueError("boom in the callback")

        astgen._index = broken
        info = helper.make_tensor_value_info
        node = helper.make_node("Relu", ["x"], ["y"], name="k")
        graph = helper.make_graph(
            [node], "g", [info("x", 1, [4, 8])], [info("y", 1, [4, 8])]
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10
        )
        prog = po.load(model)
        try:
            print(prog.schedule("k"))
        except ValueError as error:
            print("raised:", error, error.__notes__)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "raised: boom in the callback" in done.stdout
    assert "building the AST of kernel 'k'" in done.stdout


def test_a_conv_whose_strides_pass_64_bits_is_refused_by_name():
    """pads = 2**40 made the output 2**82 elements: its strides raised inside the AST
    callback, and the process died."""
    done = _run(
        """
        from onnx import TensorProto, helper
        import polyonnx as po
        from polyonnx.errors import PolyonnxError

        info = helper.make_tensor_value_info
        big = 2**41 + 2
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[2**40] * 4)
        graph = helper.make_graph(
            [node], "g", [info("x", 1, [1, 1, 4, 4]), info("w", 1, [1, 1, 3, 3])],
            [info("y", 1, [1, 1, big, big])],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10
        )
        try:
            po.InferenceSession(model)
        except PolyonnxError as error:
            print(type(error).__name__, error)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "64" in done.stdout and "Error" in done.stdout.split()[0]
    assert "exception in call back" not in done.stderr


def test_the_first_error_is_raised_and_later_callbacks_do_not_run():
    union = isl.UnionSet("{ A[i] : 0 <= i < 2; B[j] : 0 <= j < 3; C[k] : 0 <= k < 4 }")
    calls = []

    def fail(part):
        calls.append(part.get_tuple_name())
        raise ScheduleError(f"no {part.get_tuple_name()}")

    with pytest.raises(ScheduleError) as caught, isl_callbacks("testing") as guard:
        union.foreach_set(guard.each(fail))
    assert len(calls) == 1 and str(caught.value) == f"no {calls[0]}"
    assert "while testing" in caught.value.__notes__[0]


def test_keyboard_interrupt_in_a_callback_reaches_the_caller():
    def interrupt(_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), isl_callbacks("testing") as guard:
        isl.UnionSet("{ A[i] : 0 <= i < 2 }").foreach_set(guard.each(interrupt))


def test_a_descent_stops_and_a_node_callback_returns_its_node():
    with isl_callbacks("testing") as guard:
        assert guard.descend(lambda n: 1 / 0)("node") is False
        assert guard.node(lambda n, b: 1 / 0)("node", "build") == "node"
        assert isinstance(guard.error, ZeroDivisionError)
        guard.error = None  # seen: the block ends cleanly


def test_visit_lists_what_isl_visits():
    pa = isl.PwAff("{ [i] -> [(i)] : i < 0; [i] -> [(2i)] : i >= 0 }")
    assert len(visit(pa, "foreach_piece")) == 2
    assert tuple_names(isl.UnionSet("{ A[i] : 0 <= i < 2; B[j] : 0 <= j < 3 }")) == {"A", "B"}


def _unguarded_callbacks() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            method = node.func.attr
            if not method.startswith(CALLBACK_METHODS) or not node.args:
                continue
            fn = node.args[0]
            safe = (
                isinstance(fn, ast.Call)
                and isinstance(fn.func, ast.Attribute)
                and fn.func.attr in GUARDED
            )
            if not safe:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {method}")
    return found


def test_every_isl_callback_in_the_package_goes_through_the_guard():
    assert _unguarded_callbacks() == []


def test_the_scan_finds_an_unguarded_callback(tmp_path, monkeypatch):
    (tmp_path / "bad.py").write_text("def f(u, out):\n    u.foreach_set(lambda s: out.append(s))\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert _unguarded_callbacks() == ["bad.py:2 foreach_set"]
