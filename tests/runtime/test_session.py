"""InferenceSession (polyonnx/runtime/session.py): onnxruntime's surface (get_inputs,
get_outputs, run) and the validation of everything given to it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import polyonnx
from polyonnx.errors import InputError
from polyonnx.krnl.lower import supported_ops
from tests.helpers import assert_matches, make_model, random_array, value_info


def _two_input_model() -> onnx.ModelProto:
    """y = a[N, 3] + b[3]; m = a[N, 3] > 0; c = Cast(k, double); k is int64 [2, M]."""
    nodes = [
        helper.make_node("Add", ["a", "b"], ["y"]),
        helper.make_node("Greater", ["a", "zero"], ["m"]),
        helper.make_node("Cast", ["k"], ["c"], to=onnx.TensorProto.DOUBLE),
    ]
    inputs = [
        value_info("a", np.float32, ["N", 3]),
        value_info("b", np.float32, [3]),
        value_info("k", np.int64, [2, "M"]),
    ]
    outputs = [
        value_info("y", np.float32, ["N", 3]),
        value_info("m", np.bool_, ["N", 3]),
        value_info("c", np.float64, [2, "M"]),
    ]
    return make_model(nodes, inputs, outputs, {"zero": np.array(0, np.float32)})


def _feed(n: int = 4, m: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "a": random_array(rng, (n, 3)),
        "b": random_array(rng, (3,)),
        "k": random_array(rng, (2, m), np.int64, -100, 100),
    }


def _expected(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [feed["a"] + feed["b"], feed["a"] > 0, feed["k"].astype(np.float64)]


@pytest.fixture(scope="module")
def session() -> polyonnx.InferenceSession:
    return polyonnx.InferenceSession(_two_input_model())


# ---- the onnxruntime surface ------------------------------------------------------------


def test_inputs_and_outputs_are_described_as_onnxruntime_does(session):
    ort = pytest.importorskip("onnxruntime")
    reference = ort.InferenceSession(_two_input_model().SerializeToString())
    for ours, theirs in (
        (session.get_inputs(), reference.get_inputs()),
        (session.get_outputs(), reference.get_outputs()),
    ):
        assert [(a.name, list(a.shape), a.type) for a in ours] == [
            (a.name, list(a.shape), a.type) for a in theirs
        ]


def test_inputs_and_outputs_names_shapes_types(session):
    assert [(a.name, a.shape, a.type) for a in session.get_inputs()] == [
        ("a", ["N", 3], "tensor(float)"),
        ("b", [3], "tensor(float)"),
        ("k", [2, "M"], "tensor(int64)"),
    ]
    assert [(a.name, a.shape, a.type) for a in session.get_outputs()] == [
        ("y", ["N", 3], "tensor(float)"),
        ("m", ["N", 3], "tensor(bool)"),
        ("c", [2, "M"], "tensor(double)"),
    ]


def test_run_all_outputs(session):
    feed = _feed()
    got = session.run(None, feed)
    assert len(got) == 3
    for actual, want in zip(got, _expected(feed), strict=True):
        assert_matches(actual, want)


def test_run_named_outputs_in_the_order_asked(session):
    feed = _feed()
    y, m, c = _expected(feed)
    (only_c,) = session.run(["c"], feed)
    assert_matches(only_c, c)
    got_m, got_y = session.run(["m", "y"], feed)
    assert_matches(got_m, m)
    assert_matches(got_y, y)


def test_unknown_output_name(session):
    with pytest.raises(InputError, match=r"'nope'.*\['y', 'm', 'c'\]"):
        session.run(["y", "nope"], _feed())


def test_symbolic_batch_runs_at_several_sizes(session):
    """N (and M) take new values per run; each size gets its own code, results are right
    whichever size ran before."""
    for n, m in ((4, 5), (1, 17), (33, 2), (4, 5)):
        feed = _feed(n, m, seed=n)
        got = session.run(None, feed)
        for actual, want in zip(got, _expected(feed), strict=True):
            assert_matches(actual, want)


def test_results_are_fresh_arrays_and_inputs_are_untouched(session):
    feed = _feed()
    kept = {k: v.copy() for k, v in feed.items()}
    first = session.run(None, feed)
    second = session.run(None, _feed(seed=9))
    for actual, want in zip(first, _expected(kept), strict=True):
        assert_matches(actual, want)  # the second run did not overwrite the first's results
    for a, b in zip(first, second, strict=True):
        assert not np.shares_memory(a, b)
    for name, value in kept.items():
        np.testing.assert_array_equal(feed[name], value)


def test_a_released_result_array_is_reused_and_a_held_one_never(session):
    first = session.run(["y"], _feed(seed=1))[0]
    address = first.ctypes.data
    del first  # nothing references the array now: the next run may write into it
    again = session.run(["y"], _feed(seed=2))[0]
    assert again.ctypes.data == address
    assert_matches(again, _expected(_feed(seed=2))[0])

    held = [session.run(["y"], _feed(seed=s))[0] for s in range(5)]  # more than it keeps
    view = session.run(["y"], _feed(seed=5))[0][1:]  # only a view of this one is held
    later = session.run(["y"], _feed(seed=6))[0]
    for seed, array in enumerate([*held, later]):
        want = _expected(_feed(seed=6 if seed == 5 else seed))[0]
        assert_matches(array, want)
    assert_matches(view, _expected(_feed(seed=5))[0][1:])
    arrays = [*held, view, later]
    assert not any(np.shares_memory(x, y) for i, x in enumerate(arrays) for y in arrays[i + 1 :])


def test_non_contiguous_inputs(session):
    rng = np.random.default_rng(1)
    a = random_array(rng, (3, 6))[:, ::2].T  # (3, 3), neither C- nor F-contiguous rows
    b = random_array(rng, (6,))[::2]
    k = np.asfortranarray(random_array(rng, (2, 4), np.int64, -9, 9))
    feed = {"a": a, "b": b, "k": k}
    for actual, want in zip(session.run(None, feed), _expected(feed), strict=True):
        assert_matches(actual, want)


def test_read_only_and_empty_inputs(session):
    feed = _feed(n=3)
    for array in feed.values():
        array.setflags(write=False)  # its address cannot come through a writable buffer
    for actual, want in zip(session.run(None, feed), _expected(feed), strict=True):
        assert_matches(actual, want)
    empty = _feed(n=0, m=0)
    results = session.run(None, empty)
    assert [r.shape for r in results] == [(0, 3), (0, 3), (2, 0)]


def test_model_from_path_bytes_and_proto(tmp_path):
    model = _two_input_model()
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    feed = _feed()
    for source in (model, model.SerializeToString(), str(path), path):
        got = polyonnx.InferenceSession(source).run(["y"], feed)
        assert_matches(got[0], feed["a"] + feed["b"])


def test_rank0_input_and_output():
    model = make_model(
        [helper.make_node("Mul", ["s", "s"], ["y"])],
        [value_info("s", np.float32, [])],
        [value_info("y", np.float32, [])],
    )
    (y,) = polyonnx.InferenceSession(model).run(None, {"s": np.array(3, np.float32)})
    assert_matches(y, np.array(9, np.float32))


# ---- input validation -------------------------------------------------------------------


def test_unknown_input_name(session):
    feed = {**_feed(), "extra": np.zeros(3, np.float32)}
    with pytest.raises(InputError, match=r"'extra'.*\['a', 'b', 'k'\]"):
        session.run(None, feed)


def test_missing_input(session):
    feed = _feed()
    del feed["b"]
    with pytest.raises(InputError, match=r"missing.*'b'.*\['a', 'b', 'k'\]"):
        session.run(None, feed)


def test_wrong_dtype(session):
    feed = {**_feed(), "b": np.zeros(3, np.float64)}
    with pytest.raises(InputError, match=r"'b'.*expected dtype float32, given float64"):
        session.run(None, feed)


def test_wrong_rank(session):
    feed = {**_feed(), "a": np.zeros((2, 3, 1), np.float32)}
    with pytest.raises(InputError, match=r"'a'.*expected rank 2.*given rank 3.*\[2, 3, 1\]"):
        session.run(None, feed)


def test_wrong_static_dim(session):
    feed = {**_feed(), "b": np.zeros(4, np.float32)}
    with pytest.raises(InputError, match=r"'b'.*expected shape \[3\], given \[4\]"):
        session.run(None, feed)


def test_inconsistent_symbolic_dims():
    """Two inputs share the symbol N; the second disagrees with the first."""
    model = make_model(
        [helper.make_node("Add", ["p", "q"], ["y"])],
        [value_info("p", np.float32, ["N", 2]), value_info("q", np.float32, ["N", 2])],
        [value_info("y", np.float32, ["N", 2])],
    )
    session = polyonnx.InferenceSession(model)
    feed = {"p": np.zeros((3, 2), np.float32), "q": np.zeros((5, 2), np.float32)}
    with pytest.raises(InputError, match=r"'q'.*'N'.*'p'.* 3.* 5"):
        session.run(None, feed)
    feed["q"] = np.ones((3, 2), np.float32)
    assert_matches(session.run(None, feed)[0], np.ones((3, 2), np.float32))


def test_input_errors_are_value_errors(session):
    """onnxruntime callers catch ValueError-ish failures; InputError is one."""
    with pytest.raises(ValueError):
        session.run(None, {})


# ---- session creation -------------------------------------------------------------------


@pytest.mark.parametrize("threads", [0, -2])
def test_threads_must_be_positive(threads):
    with pytest.raises(ValueError, match=f"threads.*{threads}"):
        polyonnx.InferenceSession(_two_input_model(), threads=threads)


def test_threads_one_runs():
    session = polyonnx.InferenceSession(_two_input_model(), threads=1)
    feed = _feed()
    assert_matches(session.run(["y"], feed)[0], feed["a"] + feed["b"])


def test_unsupported_ops_are_all_named_at_creation():
    """Two unsupported op types (one used twice) fail in one error naming every op type
    and node, and nothing about the supported node."""
    assert not {"Det", "NonZero"} & supported_ops(), "pick op types polyonnx cannot lower"
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="fine"),
        helper.make_node("Det", ["x"], ["d"], name="det_a"),
        helper.make_node("NonZero", ["r"], ["nz1"], name="nz_a"),
        helper.make_node("NonZero", ["x"], ["nz2"], name="nz_b"),
    ]
    model = make_model(
        nodes,
        [value_info("x", np.float32, [3, 3])],
        [
            value_info("d", np.float32, []),
            value_info("nz1", np.int64, [2, None]),
            value_info("nz2", np.int64, [2, None]),
        ],
    )
    with pytest.raises(polyonnx.UnsupportedOpError) as err:
        polyonnx.InferenceSession(model)
    assert err.value.ops == {"Det": ["det_a"], "NonZero": ["nz_a", "nz_b"]}
    message = str(err.value)
    for word in ("Det", "NonZero", "det_a", "nz_a", "nz_b"):
        assert word in message
    assert "fine" not in message


def test_unnamed_dims_are_described_as_none():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [value_info("x", np.float32, [None, 3, "B"])],
        [value_info("y", np.float32, [None, 3, "B"])],
    )
    session = polyonnx.InferenceSession(model)
    assert session.get_inputs()[0].shape == [None, 3, "B"]
    assert session.get_outputs()[0].shape == [None, 3, "B"]


def test_a_static_model_validates_each_run_as_a_symbolic_one_does():
    """Static shapes take a quick check; whatever fails it gets the full check's error."""
    model = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [value_info("a", np.float32, [2, 3]), value_info("b", np.float32, [3])],
        [value_info("y", np.float32, [2, 3])],
    )
    session = polyonnx.InferenceSession(model)
    rng = np.random.default_rng(0)
    a, b = random_array(rng, (2, 3)), random_array(rng, (3,))
    assert_matches(session.run(None, {"a": a, "b": b})[0], a + b)
    strided = random_array(rng, (3, 4))[:, ::2].T  # (2, 3), not C-contiguous
    assert_matches(session.run(None, {"a": strided, "b": b})[0], strided + b)
    wrong = {
        r"unknown input.*'c'": {"a": a, "c": b},
        r"'b'.*expected dtype float32, given float64": {"a": a, "b": b.astype(np.float64)},
        r"'a'.*expected shape \[2, 3\], given \[3, 2\]": {"a": a.T.copy(), "b": b},
        r"'a'.*expected rank 2": {"a": a[None], "b": b},
    }
    for message, feed in wrong.items():
        with pytest.raises(InputError, match=message):
            session.run(None, feed)
