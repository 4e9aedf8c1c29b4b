"""The C side of a library: examples/deploy/deploy.c prints and writes what
InferenceSession gives, bit for bit, and a C program linking the library directly gets
a status and a message for every wrong call."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import polyonnx
from polyonnx.runtime.library import compile_library

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
TORCH = ROOT / "tests" / "data" / "torch"
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler to build the C programs")


@pytest.fixture(scope="module")
def deploy(tmp_path_factory) -> Path:
    """The example built with the command docs/deploy.md gives."""
    out = tmp_path_factory.mktemp("deploy") / "deploy"
    source = ROOT / "examples" / "deploy" / "deploy.c"
    subprocess.run([CC, "-O2", "-o", str(out), str(source), "-ldl"], check=True)
    return out


@pytest.mark.parametrize(
    ("model", "shapes"),
    [(MLP, {}), (TORCH / "resnet_torchscript.onnx", {"x": [2, 3, 32, 32]})],
)
def test_deploy_writes_what_the_session_computes(deploy, model, shapes, tmp_path):
    library = compile_library(model, tmp_path, "net", input_shapes=shapes).library
    session = polyonnx.InferenceSession(model, threads=2)
    rng = np.random.default_rng(3)
    feed = {
        i.name: rng.standard_normal(shapes.get(i.name, i.shape)).astype(np.float32)
        for i in session.get_inputs()
    }
    paths = []
    for i, array in enumerate(feed.values()):
        paths.append(tmp_path / f"in{i}.npy")
        np.save(paths[-1], array)
    done = subprocess.run(
        [str(deploy), str(library), *map(str, paths), "-o", str(tmp_path), "-t", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for output, want in zip(session.get_outputs(), session.run(None, feed), strict=True):
        got = np.load(tmp_path / f"{output.name.replace('/', '_')}.npy")
        np.testing.assert_array_equal(got, want)
        assert f"output {output.name} {list(want.shape)}:" in done.stdout


def test_deploy_reads_raw_inputs_and_refuses_a_wrong_size(deploy, tmp_path):
    library = compile_library(MLP, tmp_path, "mlp").library
    x = np.random.default_rng(0).standard_normal((8, 784)).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    subprocess.run([str(deploy), str(library), str(tmp_path / "x.bin"), "-o", str(tmp_path)],
                   check=True, capture_output=True)  # fmt: skip
    want = polyonnx.InferenceSession(MLP).run(None, {"input": x})[0]
    np.testing.assert_array_equal(np.load(tmp_path / "probs.npy"), want)
    (tmp_path / "short.bin").write_bytes(x.tobytes()[:-4])
    done = subprocess.run([str(deploy), str(library), str(tmp_path / "short.bin")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1
    assert "the file's size is not the input's" in done.stderr


def test_c_program_gets_a_status_and_message_for_each_wrong_call(tmp_path):
    compile_library(MLP, tmp_path, "mlp")
    program = tmp_path / "checks"
    source = ROOT / "tests" / "runtime" / "capi_checks.c"
    subprocess.run(
        [CC, "-O2", "-I", str(tmp_path), "-o", str(program), str(source),
         "-L", str(tmp_path), "-lmlp", f"-Wl,-rpath,{tmp_path}"],
        check=True,
    )  # fmt: skip
    lines = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    report = dict(line.split(": ", 1) for line in lines.splitlines() if ": " in line)
    assert report["wrong dims"].startswith(
        "2 input 0 'input': expected dims [8, 784], given [8, 785] (dim 1 must be 784, is 785)"
    )
    assert report["small output"].startswith("3 output 0 'probs': the buffer has 319 bytes")
    assert report["null inputs"].startswith("1 inputs, outputs and output_bytes")
    assert report["unaligned"].startswith("3 input 0 'input': the data is not aligned")
    assert report["right"].strip() == "0"
    assert "rank 2 dims 8 784 name input type 1 count 1 1" in lines
    assert "out of range (nil) -1" in lines
