"""Every argument of the public entry points (InferenceSession, run, polyonnx.load, the
backend) is checked up front: a bad one raises a PolyonnxError subclass naming the
argument, what was expected and what was given, never an AttributeError or TypeError from
deep inside. The hypothesis tests throw junk at each argument and accept only a
PolyonnxError or a correct result."""

from __future__ import annotations

import re
import tempfile

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

import polyonnx
import polyonnx.backend as backend
from polyonnx.errors import ArgumentError, InputError, ModelError, PolyonnxError, TuningError
from polyonnx.runtime.arguments import MAX_THREADS
from tests.helpers import fast, make_model, value_info

SHAPE = (2, 3)


def _add_model() -> onnx.ModelProto:
    """y = a[2, 3] + b[3], float32."""
    return make_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [value_info("a", np.float32, SHAPE), value_info("b", np.float32, SHAPE[1:])],
        [value_info("y", np.float32, SHAPE)],
    )


MODEL = _add_model()
A = np.arange(6, dtype=np.float32).reshape(SHAPE) - 2.5
B = np.array([1.0, -2.0, 0.5], np.float32)


def _session(model=MODEL, *args, **kwargs) -> polyonnx.InferenceSession:
    """A session without the shipped tuning records (not what these tests are about)."""
    return polyonnx.InferenceSession(model, *args, tuning_db=False, **kwargs)


@pytest.fixture(scope="module")
def session() -> polyonnx.InferenceSession:
    return _session()


# ---- threads ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threads", "shown"),
    [
        (0, "given 0"),
        (-1, "given -1"),
        (MAX_THREADS + 1, f"given {MAX_THREADS + 1}"),
        (2**40, f"given {2**40}"),
        ("2", "given str '2'"),
        (2.5, "given float 2.5"),
        (True, "given bool True"),
        (False, "given bool False"),
        ([2], "given list [2]"),
    ],
)
def test_bad_threads_are_argument_errors_naming_the_value(threads, shown):
    with pytest.raises(ArgumentError, match=rf"threads must be .*{re.escape(shown)}"):
        _session(threads=threads)


def test_threads_true_is_refused_before_the_tuning_records_are_read():
    """The records were read with threads=True first and failed as a TuningError."""
    with pytest.raises(ArgumentError, match="threads"):
        polyonnx.InferenceSession(MODEL, threads=True)


def test_argument_errors_are_type_and_value_errors():
    for bad in (0, "2"):
        with pytest.raises(ValueError):
            _session(threads=bad)
        with pytest.raises(TypeError):
            _session(threads=bad)


def test_numpy_int_threads_and_none_run():
    for threads in (np.int64(2), None):
        (y,) = _session(threads=threads).run(None, {"a": A, "b": B})
        np.testing.assert_array_equal(y, A + B)


def test_session_options_in_threads_place_gets_a_hint():
    class SessionOptions:  # what onnxruntime code passes second
        pass

    with pytest.raises(ArgumentError, match="not SessionOptions"):
        _session(MODEL, SessionOptions())


# ---- the model argument -----------------------------------------------------------------


@pytest.mark.parametrize("model", [None, 3, 2.5, True, [MODEL], {}, np.zeros(3)])
def test_a_model_of_no_readable_type_is_a_model_error(model):
    shown = "None" if model is None else type(model).__name__
    with pytest.raises(ModelError, match=rf"the model must be a path.*given {shown}"):
        _session(model)


def test_model_paths_that_are_no_model(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all \xff\xfe")
    cases = {
        str(tmp_path): "is a directory",
        str(tmp_path / "missing.onnx"): "not found",
        str(tmp_path / "empty.onnx"): "empty.onnx",
        str(tmp_path / "junk.onnx"): "junk.onnx",
        "": "non-empty",
        "a\0b": "non-empty",
    }
    for path, message in cases.items():
        with pytest.raises(ModelError, match=message):
            _session(path)


def test_model_bytes_that_are_no_model():
    for data in (b"", b"junk", bytearray(b"\x08\x01")):
        with pytest.raises(ModelError):
            _session(data)


def test_a_directory_is_named_as_one_by_load_too(tmp_path):
    with pytest.raises(ModelError, match="is a directory"):
        polyonnx.load(tmp_path)


# ---- the other arguments of InferenceSession --------------------------------------------


@pytest.mark.parametrize("cache", ["", 3, [1], b"dir"])
def test_bad_cache_arguments(cache):
    with pytest.raises(ArgumentError, match=r"cache must be"):
        _session(cache=cache)


def test_a_cache_that_is_a_file_is_refused(tmp_path):
    """It used to be taken (and every store silently failed); '' meant the working dir."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArgumentError, match=r"cache must name a directory.*is a file"):
        _session(cache=tmp_path / "file")


@pytest.mark.parametrize("db", ["", 3, [1], 2.5])
def test_bad_tuning_db_arguments(db):
    with pytest.raises(ArgumentError, match=r"tuning_db must be"):
        polyonnx.InferenceSession(MODEL, tuning_db=db)


def test_tuning_db_that_is_a_directory_or_missing(tmp_path):
    with pytest.raises(ArgumentError, match=r"tuning_db must name a file.*is a directory"):
        polyonnx.InferenceSession(MODEL, tuning_db=tmp_path)
    with pytest.raises(TuningError, match="no tuning database"):
        polyonnx.InferenceSession(MODEL, tuning_db=tmp_path / "missing.db")


@pytest.mark.parametrize("profile", ["yes", "", 1, None, [1]])
def test_profile_must_be_a_bool(profile):
    """``profile="no"`` used to switch profiling on (bool("no") is True)."""
    with pytest.raises(ArgumentError, match=r"profile must be True or False"):
        _session(profile=profile)


def test_unknown_keywords_and_extra_positionals_are_named():
    with pytest.raises(ArgumentError, match=r"unknown keyword.*\['providers'\].*cache"):
        _session(providers=["CPUExecutionProvider"])
    with pytest.raises(ArgumentError, match=r"positionally, given 3 positional"):
        _session(MODEL, 1, ["CPUExecutionProvider"])


def test_target_must_be_a_target():
    with pytest.raises(ArgumentError, match=r"target must be a polyonnx.target.Target.*'x86'"):
        _session(target="x86")


def test_records_must_be_records():
    from polyonnx.runtime.session import InferenceSession

    with pytest.raises(ArgumentError, match="records must be"):
        InferenceSession(MODEL, records="db.sqlite")


def test_limits_reach_the_loader_from_the_session_and_load():
    from polyonnx.frontend.limits import Limits

    small = Limits(max_tensor_elements=4)  # 'a' has 6
    with pytest.raises(ModelError, match="'a'"):
        _session(limits=small)
    with pytest.raises(ModelError, match="'a'"):
        polyonnx.load(MODEL, limits=small)
    for call in (lambda: _session(limits=8 << 30), lambda: polyonnx.load(MODEL, limits={})):
        with pytest.raises(ArgumentError, match="limits must be a"):
            call()
    (y,) = _session(limits=Limits()).run(None, {"a": A, "b": B})
    np.testing.assert_array_equal(y, A + B)


# ---- run(output_names, input_feed) ------------------------------------------------------


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ([A, B], r"input_feed must be a dict.*\['a', 'b'\].*given list"),
        ((A, B), r"input_feed must be a dict.*given tuple"),
        (None, r"input_feed must be a dict.*given None"),
        (A, r"input_feed must be a dict.*given ndarray"),
        ({1: A, "b": B}, r"input names must be str, given int 1"),
        ({"a": A}, r"missing input\(s\) \['b'\]"),
        ({"a": A, "c": B}, r"unknown input name\(s\) \['c'\] and missing input\(s\) \['b'\]"),
        ({"a": A.tolist(), "b": B}, r"input 'a': expected a numpy.ndarray of float32.*list"),
        ({"a": A, "b": 1.0}, r"input 'b': expected a numpy.ndarray.*given float 1.0"),
        ({"a": A, "b": memoryview(B)}, r"input 'b': expected a numpy.ndarray.*memoryview"),
        ({"a": A, "b": "1,2,3"}, r"input 'b': expected a numpy.ndarray.*str"),
        ({"a": A, "b": B.astype(object)}, r"input 'b': expected dtype float32, given object"),
        ({"a": A, "b": B.astype(">f8")}, r"input 'b': expected dtype float32, given float64"),
    ],
)
def test_bad_feeds_are_input_errors(session, feed, message):
    with pytest.raises(InputError, match=message):
        session.run(None, feed)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ("y", r"output_names must be None or a list.*\['y'\].*given str 'y'"),
        (3, r"output_names must be None or a list.*given int 3"),
        ({"y": 1}, r"output_names must be None or a list.*given dict"),
        (["y", "z"], r"unknown output name\(s\) \['z'\]; the model's outputs are \['y'\]"),
        ([1, None], r"unknown output name\(s\) \[1, None\]"),
    ],
)
def test_bad_output_names_are_input_errors(session, names, message):
    with pytest.raises(InputError, match=message):
        session.run(names, {"a": A, "b": B})


def test_empty_or_tuple_output_names_and_run_options(session):
    feed = {"a": A, "b": B}
    for names in ([], (), ("y",), ["y", "y"]):
        for y in session.run(names, feed):
            np.testing.assert_array_equal(y, A + B)
    with pytest.raises(ArgumentError, match="run_options must be None or an onnxruntime"):
        session.run(None, feed, {"log_severity_level": 3})


def test_compiled_for_and_kernel_profile_check_the_feed_too(session):
    with pytest.raises(InputError, match="input_feed must be a dict"):
        session.compiled_for([A, B])
    profiled = _session(profile=True)
    with pytest.raises(InputError, match="input_feed must be a dict"):
        profiled.kernel_profile([A, B])


def test_big_endian_inputs_are_converted_not_misread(session):
    """onnxruntime reads a '>f4' array's bytes as native (1.0 becomes 4.6e-41); the
    values are what a user means, so the session converts them."""
    a, b = A.astype(">f4"), B.astype(">f4")
    (y,) = session.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(y, A + B)
    assert y.dtype == np.float32 and y.dtype.isnative


def test_unaligned_and_odd_views_give_the_same_result(session):
    raw = np.zeros(4 * 6 + 1, np.uint8)
    unaligned = raw[1:].view(np.float32).reshape(SHAPE)  # data 1 byte past alignment
    unaligned[...] = A
    assert not unaligned.flags.aligned
    reversed_view = np.ascontiguousarray(B[::-1])[::-1]  # negative stride
    for a, b in ((unaligned, B), (np.asfortranarray(A), reversed_view), (np.matrix(A), B)):
        (y,) = session.run(None, {"a": a, "b": b})
        np.testing.assert_array_equal(y, A + B)


def test_numpy_scalar_is_a_rank0_array():
    model = make_model(
        [helper.make_node("Neg", ["s"], ["y"])],
        [value_info("s", np.float32, [])],
        [value_info("y", np.float32, [])],
    )
    (y,) = _session(model).run(None, {"s": np.float32(2.5)})
    assert y.shape == () and y == -2.5


# ---- polyonnx.load ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (3, r"input_shapes must be a dict.*given int 3"),
        ([("a", [2, 3])], r"input_shapes must be a dict.*given list"),
        ({1: [2, 3]}, r"input names must be str, given int 1"),
        ({"a": 3}, r"input_shapes\['a'\] must be a list.*given int 3"),
        ({"a": "23"}, r"input_shapes\['a'\] must be a list.*given str"),
        ({"a": [2, -3]}, r"input_shapes\['a'\].*given list \[2, -3\]"),
        ({"a": [True, 3]}, r"input_shapes\['a'\].*given list \[True, 3\]"),
        ({"a": [2.0, 3]}, r"input_shapes\['a'\].*given list \[2.0, 3\]"),
    ],
)
def test_load_refuses_bad_input_shapes(shapes, message):
    with pytest.raises(InputError, match=message):
        polyonnx.load(MODEL, shapes)


def test_load_refuses_a_program_and_junk():
    with pytest.raises(ModelError, match="loaded Program"):
        polyonnx.load(polyonnx.load(MODEL))
    with pytest.raises(ModelError, match="the model must be"):
        polyonnx.load(None)


def test_load_takes_tuple_and_array_dims():
    for dims in ((2, 3), np.array([2, 3])):
        program = polyonnx.load(MODEL, {"a": dims})
        assert program.graph.inputs[0].shape == (2, 3)


# ---- the backend ------------------------------------------------------------------------


def test_backend_prepare_and_rep_run_arguments():
    with pytest.raises(ArgumentError, match="CPU only, given device 3"):
        backend.prepare(MODEL, device=3)
    with pytest.raises(ArgumentError, match="threads"):
        backend.prepare(MODEL, threads="x")
    rep = backend.prepare(MODEL, rtol=1e-3)  # onnx's runner passes such keywords
    for inputs, message in (
        (None, "inputs must be a list of arrays"),
        ("ab", "inputs must be a list of arrays"),
        (A, "inputs must be a list of arrays"),  # one array, two inputs
        ([A], r"takes 2 input\(s\)"),
    ):
        with pytest.raises(InputError, match=message):
            rep.run(inputs)
    (y,) = rep.run((A, B))
    np.testing.assert_array_equal(y, A + B)


def test_backend_run_node_arguments():
    node = helper.make_node("Add", ["a", "b"], ["y"])
    cases = [
        ((None, [A, B]), {}, ModelError, "NodeProto, given None"),
        ((node, None), {}, InputError, "list of arrays"),
        ((node, [A]), {}, InputError, r"2 named input\(s\) \['a', 'b'\], given 1"),
        ((node, [A, B, B]), {}, InputError, "given 3 arrays"),
        ((node, [A, [1, 2, 3]]), {}, InputError, "input 'b': expected a numpy.ndarray"),
        ((node, [A, B]), {"outputs_info": [3]}, ArgumentError, "must be \\(dtype, shape\\)"),
        ((node, [A, B]), {"outputs_info": 3}, ArgumentError, "outputs_info must be a list"),
        ((node, [A, B]), {"outputs_info": [("x", [2])]}, InputError, "no ONNX type"),
        ((node, [A, B]), {"outputs_info": [(np.float32, 2)]}, ArgumentError, "shape must"),
        ((node, [A, B]), {"opset_version": "17"}, ArgumentError, "opset_version must"),
        ((node, [A, B]), {"opset_version": 10**6}, ArgumentError, "opset_version must"),
        ((node, [A, np.array([1], "M8[s]")]), {}, InputError, "no ONNX type"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            backend.run_node(*args, **kwargs)
    (y,) = backend.run_node(node, [A, B], outputs_info=[(np.float32, [2, 3])])
    np.testing.assert_array_equal(y, A + B)


# ---- junk at every argument -------------------------------------------------------------

DTYPES = [
    np.dtype(t).newbyteorder(order)
    for t in ("f4", "f8", "f2", "i1", "i2", "i4", "i8", "u1", "u4", "u8", "b1", "c8", "U3")
    for order in ("<", ">")
]
ARRAYS = hnp.arrays(
    st.sampled_from(DTYPES), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(0, 4), max_size=3),
    ARRAYS,
)
CACHE_DIR = tempfile.mkdtemp(prefix="polyonnx-args-")
"""A compile cache for the junk tests, so that valid arguments compile once."""


def _views(array: np.ndarray):
    """``array`` and some views of it: strided, reversed, transposed."""
    views = [array, array.T] + ([array[..., ::-1], array[::2]] if array.ndim else [])
    return st.sampled_from(views)


@st.composite
def feeds(draw):
    """Mostly dicts of arrays (right or wrong dtype, shape, order, layout), sometimes
    junk in any place."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JUNK)
    feed = {}
    for name, shape in (("a", SHAPE), ("b", SHAPE[1:])):
        kind = draw(st.integers(0, 5))
        if kind == 0:
            continue  # missing
        if kind == 1:
            feed[name] = draw(JUNK)
        elif kind == 2:
            feed[name] = draw(ARRAYS.flatmap(_views))
        else:
            dtype = draw(st.sampled_from(["<f4", ">f4", "=f4"]))
            base = draw(hnp.arrays(dtype, (shape[0] * 2, *shape[1:]), elements=st.floats(width=32)))
            feed[name] = base[::2] if draw(st.booleans()) else base[: shape[0]]
    if draw(st.integers(0, 5)) == 0:
        feed[draw(st.one_of(st.text(max_size=3), st.integers()))] = draw(JUNK)
    return feed


def _expect_polyonnx_error_or(result_check, call):
    """``call()`` raises a PolyonnxError, or returns what ``result_check`` accepts."""
    try:
        result = call()
    except PolyonnxError:
        return
    result_check(result)


def _is_float32(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.newbyteorder("=") == np.float32


@fast(200)
@given(
    output_names=st.one_of(
        st.none(), st.just(["y"]), st.lists(st.sampled_from(["y", "z", ""]), max_size=2), JUNK
    ),
    feed=feeds(),
)
def test_run_with_junk_raises_polyonnx_errors_or_adds(session, output_names, feed):
    def check(result):
        a, b = feed["a"], feed["b"]
        assert _is_float32(a) and _is_float32(b)
        assert a.shape == SHAPE and b.shape == SHAPE[1:]
        want = a.astype(np.float32) + b.astype(np.float32)
        for y in result:
            np.testing.assert_array_equal(y, want)

    _expect_polyonnx_error_or(check, lambda: session.run(output_names, feed))


@fast(40)
@given(
    model=st.one_of(st.just(MODEL), st.just(MODEL.SerializeToString()), JUNK),
    threads=st.one_of(st.none(), st.integers(-2, MAX_THREADS + 2), JUNK),
    options=st.dictionaries(
        st.sampled_from(["profile", "cache", "tuning_db", "target", "limits", "other"]),
        st.one_of(st.just(False), st.just(CACHE_DIR), JUNK),
        max_size=3,
    ),
)
def test_session_with_junk_raises_polyonnx_errors_or_runs(model, threads, options):
    if any(
        options.get("tuning_db") is v for v in (None, True)
    ):  # the shipped records: not tested here
        options["tuning_db"] = False
    options.setdefault("cache", CACHE_DIR)

    def check(session):
        (y,) = session.run(None, {"a": A, "b": B})
        np.testing.assert_array_equal(y, A + B)

    _expect_polyonnx_error_or(check, lambda: polyonnx.InferenceSession(model, threads, **options))


@fast(60)
@given(
    model=st.one_of(st.just(MODEL), JUNK),
    shapes=st.one_of(
        st.none(),
        JUNK,
        st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(JUNK, st.just([2, 3]))),
    ),
)
def test_load_with_junk_raises_polyonnx_errors_or_loads(model, shapes):
    def check(program):
        assert isinstance(program, polyonnx.Program)

    _expect_polyonnx_error_or(check, lambda: polyonnx.load(model, shapes))


@fast(60)
@given(
    inputs=st.one_of(JUNK, st.lists(st.one_of(ARRAYS, JUNK), max_size=3), st.just([A, B])),
    outputs_info=st.one_of(st.none(), JUNK, st.just([(np.float32, [2, 3])])),
    opset=st.one_of(st.none(), st.just(17), JUNK),
)
def test_run_node_with_junk_raises_polyonnx_errors_or_adds(inputs, outputs_info, opset):
    node = helper.make_node("Add", ["a", "b"], ["y"])
    kwargs = {} if opset is None else {"opset_version": opset}

    def check(result):
        a, b = (np.asarray(x) for x in inputs)
        np.testing.assert_array_equal(result[0], a + b)

    _expect_polyonnx_error_or(
        check, lambda: backend.run_node(node, inputs, outputs_info=outputs_info, **kwargs)
    )


@fast(60)
@given(
    model=st.one_of(st.just(MODEL), JUNK),
    device=st.one_of(st.just("CPU"), st.just("cpu:0"), JUNK),
    threads=st.one_of(st.none(), st.integers(-1, 3), JUNK),
    inputs=st.one_of(st.just([A, B]), st.just({"a": A, "b": B}), feeds(), JUNK),
    run_options=st.one_of(st.none(), JUNK),
)
def test_backend_and_run_options_with_junk(model, device, threads, inputs, run_options):
    def check(outputs):
        a, b = (inputs[0], inputs[1]) if isinstance(inputs, list) else (inputs["a"], inputs["b"])
        np.testing.assert_array_equal(outputs[0], a.astype(np.float32) + b.astype(np.float32))

    def prepare_and_run():
        rep = backend.prepare(model, device, threads=threads)
        (y,) = rep.session.run(None, {"a": A, "b": B}, run_options)
        np.testing.assert_array_equal(y, A + B)
        return rep.run(inputs)

    _expect_polyonnx_error_or(check, prepare_and_run)
