"""polyonnx compile's libraries: what they link, their C API's checks, and
InferenceSession('libNAME.so') against the .onnx session, bit for bit."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

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
    with pytest.raises(polyonnx.InputError, match="--shape"):
        compile_library(model, tmp_path, "dynamic")
    library = compile_library(model, tmp_path, "fixed", input_shapes={"x": [3, 4]}).library
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(polyonnx.InferenceSession(library).run(None, {"x": x})[0],
                                  np.maximum(x, 0))  # fmt: skip


def test_profiling_a_library_is_refused(mlp_library):
    with pytest.raises(polyonnx.PolyonnxError, match=r"profile the \.onnx model"):
        polyonnx.InferenceSession(mlp_library, profile=True)


def test_not_a_library_is_a_model_error(tmp_path):
    fake = tmp_path / "libfake.so"
    fake.write_bytes(b"\x7fELF" + b"\0" * 60)
    with pytest.raises(polyonnx.ModelError, match=r"libfake\.so"):
        polyonnx.InferenceSession(fake)
