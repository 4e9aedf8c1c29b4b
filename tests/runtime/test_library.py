"""polyonnx compile's libraries: what they link, their C API's checks, and
InferenceSession('libNAME.so') against the .onnx session, bit for bit."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyonnx
from polyonnx.cli import main as cli
from polyonnx.runtime import session as session_module
from polyonnx.runtime.library import LibraryModel, compile_library

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
TORCH = ROOT / "tests" / "data" / "torch"
ALLOWED = {"libc.so.6", "libm.so.6", "libpthread.so.0", "ld-linux-x86-64.so.2"}


def _feed(session, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(
            np.float32
        )
        for i in session.get_inputs()
    }


@pytest.fixture(scope="module")
def mlp_library(tmp_path_factory) -> Path:
    return compile_library(MLP, tmp_path_factory.mktemp("mlp"), "mlp").library


def _needed(library: Path) -> set[str]:
    text = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    return {line.split("[")[1].split("]")[0] for line in text.splitlines() if "(NEEDED)" in line}


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_library_needs_only_the_c_library(mlp_library):
    needed = _needed(mlp_library)
    assert needed and needed <= ALLOWED, needed


@pytest.mark.parametrize("model", [MLP, TORCH / "mobilenet_torchscript.onnx"])
def test_library_session_matches_the_onnx_session_bit_for_bit(model, tmp_path, monkeypatch):
    library = compile_library(model, tmp_path, "model").library
    reference = polyonnx.InferenceSession(model, threads=2)
    feed = _feed(reference)
    expected = reference.run(None, feed)

    def no_compiling(*args, **kwargs):
        raise AssertionError("a library session compiled")

    monkeypatch.setattr(session_module, "compile_graph", no_compiling)
    session = polyonnx.InferenceSession(library, threads=2)
    assert [i.name for i in session.get_inputs()] == [i.name for i in reference.get_inputs()]
    assert [o.shape for o in session.get_outputs()] == [o.shape for o in reference.get_outputs()]
    for got, want in zip(session.run(None, feed), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_session_refuses_a_wrong_shape_before_the_library(mlp_library):
    session = polyonnx.InferenceSession(mlp_library)
    with pytest.raises(polyonnx.InputError, match=r"input 'input'.*\[8, 784\]"):
        session.run(None, {"input": np.zeros((8, 785), np.float32)})
    with pytest.raises(polyonnx.InputError, match="dtype"):
        session.run(None, {"input": np.zeros((8, 784), np.float64)})


def test_c_api_refuses_wrong_dims_and_small_buffers(mlp_library):
    model = LibraryModel(mlp_library, 1)
    run, error = model._fn["run"], model._fn["error"]
    x = np.zeros((8, 785), np.float32)
    out = np.zeros((8, 10), np.float32)
    dims = (ctypes.c_int64 * 2)(8, 785)
    inputs = (ctypes.c_void_p * 1)(x.ctypes.data)
    dims_list = (ctypes.POINTER(ctypes.c_int64) * 1)(dims)
    outputs = (ctypes.c_void_p * 1)(out.ctypes.data)
    sizes = (ctypes.c_size_t * 1)(out.nbytes)
    assert run(model._session, inputs, dims_list, outputs, sizes) == 2
    assert b"input 0 'input': expected dims [8, 784], given [8, 785]" in error(model._session)
    dims[1] = 784
    sizes[0] = out.nbytes - 4
    assert run(model._session, inputs, dims_list, outputs, sizes) == 3
    assert b"output 0 'probs': the buffer has 316 bytes, the output needs 320" in error(
        model._session
    )
    assert not out.any()  # nothing was written
    sizes[0] = out.nbytes
    outputs[0] = None
    assert run(model._session, inputs, dims_list, outputs, sizes) == 1
    assert run(None, inputs, dims_list, outputs, sizes) == 1
    assert b"NULL" in error(None)


def test_outputs_that_are_inputs_or_given_twice(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "copies",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    library = compile_library(model, tmp_path, "copies").library
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    y, x_again, y_again = polyonnx.InferenceSession(library).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(x_again, x)
    np.testing.assert_array_equal(y_again, y)


def test_weights_beside_the_library_are_mapped(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYONNX_WEIGHTS_FILE_BYTES", "1")
    written = compile_library(MLP, tmp_path / "a", "mlpw")
    assert written.weights == tmp_path / "a" / "mlpw.weights"
    moved = shutil.move(tmp_path / "a", tmp_path / "b")
    session = polyonnx.InferenceSession(Path(moved) / "libmlpw.so")
    feed = _feed(session)
    want = polyonnx.InferenceSession(MLP).run(None, feed)[0]
    np.testing.assert_array_equal(session.run(None, feed)[0], want)
    damaged = tmp_path / "c"  # a copy: the loader maps a new file, not the loaded one
    damaged.mkdir()
    shutil.copy(Path(moved) / "libmlpw.so", damaged)
    (damaged / "mlpw.weights").write_bytes(b"short")
    with pytest.raises(polyonnx.ModelError, match=r"c/mlpw\.weights \(the weights"):
        LibraryModel(damaged / "libmlpw.so", 1)


def test_two_models_in_one_process_and_sessions_in_threads(mlp_library, tmp_path):
    other = compile_library(TORCH / "lenet_torchscript.onnx", tmp_path, "lenet").library
    sessions = [polyonnx.InferenceSession(p, threads=2) for p in (mlp_library, other, other)]
    feeds = [_feed(s, seed) for seed, s in enumerate(sessions)]
    expected = [s.run(None, f) for s, f in zip(sessions, feeds, strict=True)]
    results: list = [None] * 3

    def run(i: int) -> None:
        results[i] = [sessions[i].run(None, feeds[i]) for _ in range(20)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for runs, want in zip(results, expected, strict=True):
        for got in runs:
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)


def test_compile_command_writes_library_and_header(tmp_path, capsys):
    assert cli(["compile", str(MLP), "-o", str(tmp_path), "--name", "net"]) == 0
    header = (tmp_path / "net.h").read_text()
    assert "net_session *net_open(int threads);" in header
    assert "input  0: input float32 [8, 784]" in header
    assert (tmp_path / "libnet.so").is_file()
    assert cli(["run", str(tmp_path / "libnet.so"), "--repeat", "2"]) == 0
    assert "nothing compiled" in capsys.readouterr().out


def test_bad_names_and_symbolic_dims_are_refused(tmp_path):
    with pytest.raises(polyonnx.CodegenError, match="C identifier"):
        compile_library(MLP, tmp_path, "no-dash")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    library = compile_library(model, tmp_path, "fixed", input_shapes={"x": [3, 4]}).library
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(polyonnx.InferenceSession(library).run(None, {"x": x})[0],
                                  np.maximum(x, 0))  # fmt: skip
    assert "[3, 4]" in (tmp_path / "fixed.h").read_text()


def _reduce_model(shape) -> onnx.ModelProto:
    """x -> ReduceSum over axis 0 (keepdims): it mixes the samples of x's first dim."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum")],
        "mixing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, *shape[1:]])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_symbolic_dims_that_are_not_a_batch_compile_parametric(tmp_path):
    """A dim that is not a batch (summed over), or two dims, are isl parameters of one
    parametric library (tests/runtime/test_parametric_library.py has more)."""
    sizes = {"mixing": ((1, 4), (7, 4), (33, 4)), "two": ((1, 4), (7, 3), (33, 1), (2, 129))}
    for shape, name in ((["N", 4], "mixing"), (["N", "M"], "two")):
        library = compile_library(_reduce_model(shape), tmp_path, name).library
        session = polyonnx.InferenceSession(library)
        assert session.get_inputs()[0].shape == shape
        for rows, cols in sizes[name]:
            x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
            got = session.run(None, {"x": x})[0]
            np.testing.assert_array_equal(got, x.sum(0, keepdims=True))
    library = compile_library(_reduce_model(["N", "M"]), tmp_path, "one",
                              input_shapes={"x": [2, 3]}).library  # fmt: skip
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = polyonnx.InferenceSession(library).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x.sum(0, keepdims=True))
    assert "[2, 3]" in (tmp_path / "one.h").read_text()


def batch_model() -> onnx.ModelProto:
    """Batch N in every way a library must place a sample: a Transpose puts it on axis 1
    (4 runs a sample), a Reshape of c [3, N, 2] to [3N, 2] gathers c's sample from 3 runs
    and writes 3 outer runs, Relu's is contiguous, ww is not batched, t is given twice."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0, 2], name="transpose"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Reshape", ["c", "shape"], ["v"], name="view"),
        helper.make_node("Mul", ["w", "w"], ["ww"], name="square"),
    ]
    inputs = [("a", ["N", 4, 5]), ("b", ["N", 4, 5]), ("c", [3, "N", 2]), ("w", [2, 2])]
    outputs = [("t", [4, "N", 5]), ("r", ["N", 4, 5]), ("v", [None, 2]), ("ww", [2, 2]),
               ("t", [4, "N", 5])]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "batch",
        [helper.make_tensor_value_info(n, f, shape) for n, shape in inputs],
        [helper.make_tensor_value_info(n, f, shape) for n, shape in outputs],
        [numpy_helper.from_array(np.array([-1, 2], np.int64), "shape")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def batch_feed(samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"a": (samples, 4, 5), "b": (samples, 4, 5), "c": (3, samples, 2), "w": (2, 2)}
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


@pytest.fixture(scope="module")
def batch_library(tmp_path_factory) -> Path:
    return compile_library(batch_model(), tmp_path_factory.mktemp("batch"), "batch").library


@pytest.fixture(scope="module")
def resnet_library(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("resnet")
    return compile_library(TORCH / "resnet_torchscript.onnx", directory, "resnet").library


@pytest.mark.parametrize("samples", [1, 3, 8, 0])
def test_a_batch_library_runs_every_batch_size(batch_library, samples):
    session = polyonnx.InferenceSession(batch_library, threads=2)
    assert [i.shape for i in session.get_inputs()] == [["N", 4, 5], ["N", 4, 5], [3, "N", 2],
                                                        [2, 2]]  # fmt: skip
    assert [o.shape for o in session.get_outputs()][:3] == [[4, "N", 5], ["N", 4, 5], [None, 2]]
    feed = batch_feed(samples, seed=samples)
    reference = ort.InferenceSession(batch_model().SerializeToString())
    got = session.run(None, feed)
    for a, b in zip(got, reference.run(None, feed), strict=True):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("samples", [1, 3, 8, 0])
def test_resnet_library_runs_every_batch_size(resnet_library, samples):
    session = polyonnx.InferenceSession(resnet_library, threads=2)
    assert session.get_inputs()[0].shape == ["batch", 3, 32, 32]
    rng = np.random.default_rng(samples)
    feed = {"x": rng.standard_normal((samples, 3, 32, 32)).astype(np.float32)}
    model = TORCH / "resnet_torchscript.onnx"
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    (got,) = session.run(None, feed)
    assert got.shape == want.shape == (samples, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_batch_library_header_and_dims(batch_library):
    header = (batch_library.parent / "batch.h").read_text()
    assert "input  0: a float32 [-1, 4, 5]" in header
    assert "input  2: c float32 [3, -1, 2]" in header
    assert "output 0: t float32 [4, -1, 5]" in header
    assert "output 3: ww float32 [2, 2]" in header
    assert "-1 is the batch 'N'" in header
    model = LibraryModel(batch_library, 1)
    assert model.batch == "N"
    model.run(batch_feed(3))
    dims = (ctypes.c_int64 * 3)()
    for i, want in [(0, [4, 3, 5]), (2, [9, 2]), (3, [2, 2])]:
        assert model._fn["run_output_dims"](model._session, i, dims) == 0
        assert list(dims)[: len(want)] == want
        assert model._fn["output_dims_for"](i, 7, dims) == 0
        assert list(dims)[: len(want)] == [d * 7 // 3 if d in (3, 9) else d for d in want]
    assert model._fn["output_dims_for"](0, -1, dims) == 1


def test_a_batch_library_refuses_inputs_of_different_batches(batch_library):
    feed = batch_feed(3)
    feed["b"] = feed["b"][:2]
    with pytest.raises(polyonnx.InputError, match=r"input 'b': dim 0 is the symbolic size 'N'"):
        polyonnx.InferenceSession(batch_library).run(None, feed)
    message = (
        r"input 1 'b': dim 0 is the symbolic size 'N', which input 0 'a' gave as 3; here it is 2"
    )
    with pytest.raises(polyonnx.InputError, match=message):
        LibraryModel(batch_library, 1).run(feed)
    feed = batch_feed(3)
    feed["c"] = np.zeros((3, 3, 3), np.float32)
    with pytest.raises(polyonnx.InputError, match=r"input 2 'c': expected dims \[3, -1, 2\]"):
        LibraryModel(batch_library, 1).run(feed)


def test_compile_command_needs_no_shape_for_a_batch(tmp_path, capsys):
    model = tmp_path / "batch.onnx"
    onnx.save(batch_model(), model)
    assert cli(["compile", str(model), "-o", str(tmp_path / "out")]) == 0
    assert "input  0: a float32 [-1, 4, 5]" in (tmp_path / "out" / "batch.h").read_text()
    assert cli(["run", str(tmp_path / "out" / "libbatch.so"), "--shape", "a=6,4,5",
                "--shape", "b=6,4,5", "--shape", "c=3,6,2"]) == 0  # fmt: skip
    assert "output   t: float32 [4, 6, 5]" in capsys.readouterr().out


def test_profiling_a_library_is_refused(mlp_library):
    with pytest.raises(polyonnx.PolyonnxError, match=r"profile the \.onnx model"):
        polyonnx.InferenceSession(mlp_library, profile=True)


def test_not_a_library_is_a_model_error(tmp_path):
    fake = tmp_path / "libfake.so"
    fake.write_bytes(b"\x7fELF" + b"\0" * 60)
    with pytest.raises(polyonnx.ModelError, match=r"libfake\.so"):
        polyonnx.InferenceSession(fake)


def test_a_bad_index_in_one_sample_stops_a_batch_with_a_run_error(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "idx"], ["y"], name="gather")],
        "gather",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [5]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    session = polyonnx.InferenceSession(compile_library(model, tmp_path, "gather").library)
    data = np.arange(5, dtype=np.float32) * 10
    idx = np.array([[0, 4], [-5, 2], [1, 3]], np.int64)
    np.testing.assert_array_equal(session.run(None, {"data": data, "idx": idx})[0], data[idx])
    idx[2, 1] = 5
    with pytest.raises(polyonnx.RunError, match=r"index 5 is out of range \[-5, 4\]"):
        session.run(None, {"data": data, "idx": idx})
    idx[2, 1] = 3
    np.testing.assert_array_equal(session.run(None, {"data": data, "idx": idx})[0], data[idx])


@pytest.mark.parametrize("samples", [1, 4, 0])
def test_a_batch_library_copies_outputs_per_sample(tmp_path, samples):
    """A ConstantOfShape of x's shape (one sample's constant, repeated) and x itself: the
    library copies them to every sample's place."""
    fill = numpy_helper.from_array(np.array([7], np.float32))
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill", value=fill),
        helper.make_node("Identity", ["x"], ["z"], name="same"),
    ]
    graph = helper.make_graph(
        nodes,
        "fill",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3]) for n in ("y", "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    session = polyonnx.InferenceSession(compile_library(model, tmp_path, "fill").library)
    x = np.random.default_rng(samples).standard_normal((samples, 3)).astype(np.float32)
    y, z = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.full((samples, 3), 7, np.float32))
    np.testing.assert_array_equal(z, x)
