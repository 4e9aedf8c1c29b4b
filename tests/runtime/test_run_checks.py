"""Run-time checks of values a user gives (krnl/ir.py's Checked): an index out of range
and an integer division by zero raise RunError naming the node, the op, the value and the
valid range, from the JIT, from a model loaded from the compile cache and from a library's
C API; an index in range, negative ones included, still reads what numpy reads. Integer
division never traps: MIN / -1 wraps to MIN and MIN % -1 is 0 (docs/ops.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.errors import RunError
from tests.helpers import fast, make_model, node_model, value_info

ROOT = Path(__file__).resolve().parents[2]
CC = shutil.which("cc") or shutil.which("gcc")
SESSIONS: dict[str, polyonnx.InferenceSession] = {}


def session(key: str, op_type: str, args, outputs, **attrs) -> polyonnx.InferenceSession:
    """One session per case, compiled once for every hypothesis example (only the index
    values change between them)."""
    if key not in SESSIONS:
        opset = attrs.pop("opset", 17)
        model, _ = node_model(op_type, args, outputs, opset=opset, **attrs)
        SESSIONS[key] = polyonnx.InferenceSession(model)
    return SESSIONS[key]


def index_values(low: int, high: int, size: int, extra: tuple[int, ...] = ()):
    """Arrays of ``size`` indices: all in [low, high] (or ``extra``) half the time, else
    drawn from twice that range."""
    span = high - low + 1
    inside = st.sampled_from(range(low, high + 1)) | st.sampled_from(extra or (low,))
    anywhere = st.integers(low - span, high + span) | inside
    lists = st.lists(inside, min_size=size, max_size=size)
    lists |= st.lists(anywhere, min_size=size, max_size=size)
    return lists.map(lambda values: np.array(values, np.int64))


def expect_range_error(run, name: str, op: str, bad: set[int], what: str) -> None:
    """``run()`` raises RunError for one of the ``bad`` values, with ``what`` (the range
    and where) after it."""
    with pytest.raises(RunError) as caught:
        run()
    message = str(caught.value)
    pattern = rf"node '{name}' \({op}\): \w+(?: \w+)? (-?\d+) is out of range {re.escape(what)}"
    found = re.fullmatch(pattern, message)
    assert found, message
    assert int(found.group(1)) in bad, (message, bad)


# ---- every op that reads at indices a user gives ---------------------------------------

RNG = np.random.default_rng(7)
X45 = RNG.standard_normal((6, 37)).astype(np.float32)
X34 = RNG.standard_normal((3, 37)).astype(np.float32)
SMALL = RNG.standard_normal((3, 4)).astype(np.float32)


@fast(40)
@given(idx=index_values(-6, 5, 5))
def test_gather_checks_every_index(idx):
    s = session("gather", "Gather", [X45, idx], [(np.float32, 2)], axis=0)
    run = lambda: s.run(None, {"x0": X45, "x1": idx})  # noqa: E731
    bad = {int(i) for i in idx if not -6 <= i < 6}
    if bad:
        expect_range_error(run, "gather_node", "Gather", bad, "[-6, 5] on axis 0 of 'x0'")
    else:
        np.testing.assert_array_equal(run()[0], np.take(X45, idx, axis=0))


@fast(40)
@given(values=index_values(-37, 36, 60))
def test_gather_elements_checks_every_lane(values):
    idx = values.reshape(3, 20).astype(np.int32)
    s = session("gather_elements", "GatherElements", [X34, idx], [(np.float32, 2)], axis=1)
    run = lambda: s.run(None, {"x0": X34, "x1": idx})  # noqa: E731
    bad = {int(i) for i in values if not -37 <= i < 37}
    if bad:
        expect_range_error(
            run, "gatherelements_node", "GatherElements", bad, "[-37, 36] on axis 1 of 'x0'"
        )
    else:
        want = np.take_along_axis(X34, np.where(idx < 0, idx + 37, idx), axis=1)
        np.testing.assert_array_equal(run()[0], want)


def scatter_elements_reference(data, idx, updates):
    out = data.copy()
    for j in range(idx.shape[0]):
        for c in range(idx.shape[1]):
            out[idx[j, c] % data.shape[0], c] = updates[j, c]
    return out


@pytest.mark.parametrize("op_type", ["ScatterElements", "Scatter"])
@fast(30)
@given(values=index_values(-3, 2, 8))
def test_scatter_elements_checks_every_index(op_type, values):
    idx = values.reshape(2, 4)
    updates = np.arange(8, dtype=np.float32).reshape(2, 4) + 100
    opset = 10 if op_type == "Scatter" else 17
    s = session(op_type, op_type, [SMALL, idx, updates], [(np.float32, 2)], axis=0, opset=opset)
    run = lambda: s.run(None, {"x0": SMALL, "x1": idx, "x2": updates})  # noqa: E731
    bad = {int(i) for i in values if not -3 <= i < 3}
    name = f"{op_type.lower()}_node"
    if bad:
        expect_range_error(run, name, op_type, bad, "[-3, 2] on axis 0 of 'x0'")
    else:
        np.testing.assert_array_equal(run()[0], scatter_elements_reference(SMALL, idx, updates))


@fast(30)
@given(values=index_values(-4, 3, 3))
def test_scatter_nd_checks_every_index(values):
    data = RNG.standard_normal((4, 3)).astype(np.float32)
    idx = values.reshape(3, 1)
    updates = np.arange(9, dtype=np.float32).reshape(3, 3) + 100
    s = session("scatter_nd", "ScatterND", [data, idx, updates], [(np.float32, 2)])
    run = lambda: s.run(None, {"x0": data, "x1": idx, "x2": updates})  # noqa: E731
    bad = {int(i) for i in values if not -4 <= i < 4}
    if bad:
        expect_range_error(run, "scatternd_node", "ScatterND", bad, "[-4, 3] on axis 0 of 'x0'")
        return
    want = data.copy()
    for u in range(3):
        want[idx[u, 0] % 4] = updates[u]
    np.testing.assert_array_equal(run()[0], want)


@fast(30)
@given(lens=index_values(0, 4, 3))
def test_reverse_sequence_checks_every_length(lens):
    x = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    s = session(
        "reverse", "ReverseSequence", [x, lens], [(np.float32, 3)], batch_axis=1, time_axis=0
    )
    run = lambda: s.run(None, {"x0": x, "x1": lens})  # noqa: E731
    bad = {int(n) for n in lens if not 0 <= n <= 4}
    if bad:
        expect_range_error(run, "reversesequence_node", "ReverseSequence", bad, "[0, 4] ('x1')")
        return
    want = x.copy()
    for b, n in enumerate(lens):
        want[:n, b] = x[:n, b][::-1]
    np.testing.assert_array_equal(run()[0], want)


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("op_type", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@fast(30)
@given(target=index_values(0, 3, 3, extra=(-100,)))
def test_loss_checks_every_target(op_type, target):
    s = session(
        op_type, op_type, [SMALL, target], [(np.float32, 1)], reduction="none", ignore_index=-100
    )
    run = lambda: s.run(None, {"x0": SMALL, "x1": target})  # noqa: E731
    bad = {int(t) for t in target if not 0 <= t < 4 and t != -100}
    if bad:
        what = "[0, 3] (the classes of 'x0') and is not ignore_index -100"
        expect_range_error(run, f"{op_type.lower()}_node", op_type, bad, what)
        return
    scores = SMALL if op_type == "NegativeLogLikelihoodLoss" else log_softmax(SMALL)
    want = [0.0 if t == -100 else -scores[i, t] for i, t in enumerate(target)]
    np.testing.assert_allclose(run()[0], np.array(want, np.float32), rtol=1e-5, atol=1e-6)


def test_a_check_in_a_parallel_loop_reports_one_of_the_bad_indices():
    data = RNG.standard_normal((64, 256)).astype(np.float32)
    idx = RNG.integers(0, 64, 4096)
    model, _ = node_model("Gather", [data, idx], [(np.float32, 2)], axis=0)
    s = polyonnx.InferenceSession(model, threads=2)
    np.testing.assert_array_equal(s.run(None, {"x0": data, "x1": idx})[0], data[idx])
    idx[[100, 3000]] = [64, -65]
    run = lambda: s.run(None, {"x0": data, "x1": idx})  # noqa: E731
    expect_range_error(run, "gather_node", "Gather", {64, -65}, "[-64, 63] on axis 0 of 'x0'")
    idx[[100, 3000]] = [-64, 63]  # the next run is clean again
    np.testing.assert_array_equal(run()[0], data[idx % 64])


# ---- integer division ------------------------------------------------------------------

DIVISIONS = [("Div", 0), ("Mod", 0), ("Mod", 1)]


def quotient(op: str, fmod: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op == "Div":  # truncation toward zero: a - fmod(a, b) is an exact multiple of b
        return (a - np.fmod(a, b)) // b
    return np.fmod(a, b) if fmod else np.mod(a, b)


@pytest.mark.parametrize(("op", "fmod"), DIVISIONS)
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
@fast(25)
@given(data=st.data())
def test_integer_division_by_zero_raises(op, fmod, dtype, data):
    """19 elements: vector steps and a masked tail, whose inactive lanes must not count."""
    info = np.iinfo(dtype)
    values = st.integers(max(int(info.min) + 1, -1000), min(int(info.max), 1000))
    a = np.array(data.draw(st.lists(values, min_size=19, max_size=19)), dtype)
    divisors = values.filter(bool) | st.just(0)
    b = np.array(data.draw(st.lists(divisors, min_size=19, max_size=19)), dtype)
    attrs = {"fmod": fmod} if op == "Mod" else {}
    s = session(f"{op}{fmod}{dtype}", op, [a, b], [(np.dtype(dtype), 1)], **attrs)
    run = lambda: s.run(None, {"x0": a, "x1": b})  # noqa: E731
    if (b == 0).any():
        word = "division" if op == "Div" else "modulo"
        with pytest.raises(RunError, match=rf"^node '{op.lower()}_node' \({op}\): integer {word}"):
            run()
    else:
        np.testing.assert_array_equal(run()[0], quotient(op, fmod, a, b))


def test_float_division_by_zero_is_not_an_error():
    a, b = np.ones(5, np.float32), np.zeros(5, np.float32)
    s = session("fdiv", "Div", [a, b], [(np.float32, 1)])
    assert np.isinf(s.run(None, {"x0": a, "x1": b})[0]).all()


MIN_BY_MINUS_ONE = textwrap.dedent(
    """
    import numpy as np
    import polyonnx
    from tests.helpers import node_model
    for dtype in ("int8", "int16", "int32", "int64"):
        low = np.iinfo(dtype).min
        a = np.full(19, low, dtype)  # vector lanes and the scalar or masked tail
        a[3] = 9
        b = np.full(19, -1, dtype)
        for op, fmod in (("Div", 0), ("Mod", 0), ("Mod", 1)):
            attrs = {"fmod": fmod} if op == "Mod" else {}
            model, feed = node_model(op, [a, b], [(np.dtype(dtype), 1)], **attrs)
            got = polyonnx.InferenceSession(model).run(None, feed)[0]
            print(dtype, op, fmod, got[0], got[18], got[3])
    """
)


def test_min_divided_by_minus_one_wraps_and_never_traps():
    """In a subprocess: a SIGFPE fails the test instead of killing pytest."""
    done = subprocess.run(
        [sys.executable, "-c", MIN_BY_MINUS_ONE], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    assert len(rows) == 12
    for dtype, op, fmod, first, last, nine in rows:
        low = int(np.iinfo(dtype).min)
        want = (low, -9) if op == "Div" else (0, 0)
        assert (int(first), int(last), int(nine)) == (want[0], want[0], want[1]), (dtype, op, fmod)


# ---- the compile cache and the C API ---------------------------------------------------


def checks_model() -> onnx.ModelProto:
    """A Gather of data[5] at idx[3] and an int32 Div of a[4] by b[4]."""
    nodes = [
        helper.make_node("Gather", ["data", "idx"], ["y"], name="Gather_3"),
        helper.make_node("Div", ["a", "b"], ["q"], name="Div_1"),
    ]
    inputs = [
        value_info("data", np.float32, [5]),
        value_info("idx", np.int64, [3]),
        value_info("a", np.int32, [4]),
        value_info("b", np.int32, [4]),
    ]
    outputs = [value_info("y", np.float32, [3]), value_info("q", np.int32, [4])]
    return make_model(nodes, inputs, outputs)


FEED = {
    "data": np.arange(5, dtype=np.float32),
    "idx": np.array([1, -5, 4], np.int64),
    "a": np.array([np.iinfo(np.int32).min, 7, 8, 9], np.int32),
    "b": np.array([-1, 2, -3, 4], np.int32),
}
INDEX_MESSAGE = "node 'Gather_3' (Gather): index 7 is out of range [-5, 4] on axis 0 of 'data'"
ZERO_MESSAGE = "node 'Div_1' (Div): integer division by zero"


def bad_runs(session) -> list[str]:
    """The messages of a run with idx[1] = 7 and of one with b[2] = 0."""
    messages = []
    for name, at, value in (("idx", 1, 7), ("b", 2, 0)):
        feed = {k: v.copy() for k, v in FEED.items()}
        feed[name][at] = value
        with pytest.raises(RunError) as caught:
            session.run(None, feed) if hasattr(session, "get_inputs") else session.run(feed)
        messages.append(str(caught.value))
    return messages


def test_a_model_from_the_compile_cache_raises_the_same_errors(tmp_path):
    from polyonnx.frontend.load import load_graph
    from polyonnx.krnl.lower import supported_ops
    from polyonnx.runtime.cache import CompileCache
    from polyonnx.runtime.compiled import CompiledModel, compile_graph
    from polyonnx.target import host_target

    compiled = compile_graph(load_graph(checks_model(), supported_ops=supported_ops()))
    assert bad_runs(compiled) == [INDEX_MESSAGE, ZERO_MESSAGE]
    cache = CompileCache(tmp_path)
    cache.store("k", compiled.cache_entry())
    loaded = CompiledModel.from_entry(cache.load("k"), host_target())
    assert bad_runs(loaded) == [INDEX_MESSAGE, ZERO_MESSAGE]
    got = loaded.run(FEED)
    np.testing.assert_array_equal(got["q"], [np.iinfo(np.int32).min, 3, -2, 2])


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    from polyonnx.runtime.library import compile_library

    out = tmp_path_factory.mktemp("checks")
    model = out / "checks.onnx"
    onnx.save(checks_model(), model)
    return compile_library(model, out, "checks").library


def test_a_session_over_a_library_raises_the_same_errors(library):
    s = polyonnx.InferenceSession(library)
    assert bad_runs(s) == [INDEX_MESSAGE, ZERO_MESSAGE]
    y, q = s.run(None, FEED)
    np.testing.assert_array_equal(y, [1, 0, 4])
    np.testing.assert_array_equal(q, [np.iinfo(np.int32).min, 3, -2, 2])


@pytest.mark.skipif(CC is None, reason="no C compiler to build the C program")
def test_the_c_api_returns_a_run_error_status_and_message(library, tmp_path):
    program = tmp_path / "run_checks"
    source = ROOT / "tests" / "runtime" / "capi_run_checks.c"
    directory = str(library.parent)
    subprocess.run(
        [CC, "-O2", "-I", directory, "-o", str(program), str(source),
         "-L", directory, "-lchecks", f"-Wl,-rpath,{directory}"],
        check=True,
    )  # fmt: skip
    lines = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    report = dict(line.split(": ", 1) for line in lines.splitlines())
    good = f"0 |{np.iinfo(np.int32).min} 3 -2 2"
    assert report["good"] == good
    assert report["index"].split("|")[0] == f"5 {INDEX_MESSAGE}"
    negative = INDEX_MESSAGE.replace("index 7", "index -6")
    assert report["negative"].split("|")[0] == f"5 {negative}"
    assert report["zero"].split("|")[0] == f"5 {ZERO_MESSAGE}"
    assert report["again"] == good


def test_checks_can_be_compiled_out():
    """``checks=False``: no test in the code (a bad index is clamped, a zero divisor gives
    0), no check in the ABI, no error-record parameter on any kernel."""
    from polyonnx.frontend.load import load_graph
    from polyonnx.krnl.lower import supported_ops
    from polyonnx.runtime.compiled import compile_graph

    graph = load_graph(checks_model(), supported_ops=supported_ops())
    compiled = compile_graph(graph, checks=False)
    assert compiled.abi.checks == ()
    assert not any("errors" in source for source in compiled.jit.sources)
    feed = {k: v.copy() for k, v in FEED.items()}
    feed["idx"][1], feed["b"][2] = 7, 0
    got = compiled.run(feed)
    np.testing.assert_array_equal(got["y"], [1, 4, 4])
    np.testing.assert_array_equal(got["q"], [np.iinfo(np.int32).min, 3, 0, 2])
    assert len(compile_graph(graph).abi.checks) == 2


def test_a_session_compiles_checks_out_on_request_and_keys_the_cache_by_it(tmp_path):
    """InferenceSession(checks=False) runs the unchecked code; the compile cache keeps the
    two apart, so a cached checked build never answers an unchecked session or back."""
    feed = {k: v.copy() for k, v in FEED.items()}
    feed["idx"][1] = 7
    for _ in range(2):  # the second round loads both from the cache
        checked = polyonnx.InferenceSession(checks_model(), cache=tmp_path, tuning_db=False)
        with pytest.raises(RunError, match="index 7"):
            checked.run(None, feed)
        unchecked = polyonnx.InferenceSession(
            checks_model(), cache=tmp_path, tuning_db=False, checks=False
        )
        np.testing.assert_array_equal(unchecked.run(None, feed)[0], [1, 4, 4])
    with pytest.raises(polyonnx.ArgumentError, match="checks"):
        polyonnx.InferenceSession(checks_model(), checks="no")


def test_the_cli_compiles_checks_out_with_no_checks(tmp_path, capsys):
    from polyonnx.cli import main

    model = tmp_path / "checks.onnx"
    onnx.save(checks_model(), model)
    args = ["run", str(model), "--no-cache", "--no-tuning"]
    for name, value in {**FEED, "idx": np.array([0, 7, 2], np.int64)}.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / name}.npy"]
    assert main(args) == 2
    assert "index 7 is out of range" in capsys.readouterr().err
    assert main([*args, "--no-checks"]) == 0
