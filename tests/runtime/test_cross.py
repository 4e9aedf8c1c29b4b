"""Libraries for other CPUs: aarch64 code run under qemu-user, and AVX2-only and SSE-only
x86-64 code run here, against the host's outputs (rtol 1e-5). Under CI=true the tools
(.ci/run installs them) must be there: a missing one fails instead of skipping."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polyonnx
from polyonnx.runtime.library import compile_library
from polyonnx.target import make_target

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
LENET = ROOT / "tests" / "data" / "torch" / "lenet_torchscript.onnx"
SYSROOT = "/usr/aarch64-linux-gnu"
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _require(ok: bool, what: str) -> None:
    if ok:
        return
    if CI:
        pytest.fail(f"{what} is missing: .ci/run installs it")
    pytest.skip(f"{what} is not installed (.ci/run installs it)")


def _feed(model: Path, seed: int) -> dict[str, np.ndarray]:
    session = polyonnx.InferenceSession(model, threads=1)
    rng = np.random.default_rng(seed)
    shape = [d if isinstance(d, int) else 2 for d in session.get_inputs()[0].shape]
    return {session.get_inputs()[0].name: rng.standard_normal(shape).astype(np.float32)}


def _host_outputs(model: Path, feed) -> tuple[list[np.ndarray], dict[str, list[int]]]:
    shapes = {n: list(a.shape) for n, a in feed.items()}
    return polyonnx.InferenceSession(model, threads=1).run(None, feed), shapes


@pytest.mark.parametrize("model", [MLP, LENET], ids=["mlp", "lenet"])
def test_aarch64_library_under_qemu_matches_the_host(model, tmp_path):
    _require(importlib.util.find_spec("ziglang") is not None, "the ziglang package (zig cc)")
    _require(shutil.which("qemu-aarch64") is not None, "qemu-user (qemu-aarch64)")
    _require(Path(SYSROOT, "lib", "ld-linux-aarch64.so.1").exists(), "libc6-arm64-cross")
    feed = _feed(model, 1)
    want, shapes = _host_outputs(model, feed)
    target = make_target("aarch64-linux-gnu", "neoverse-n1")
    library = compile_library(model, tmp_path, "net", target=target, input_shapes=shapes).library
    deploy = tmp_path / "deploy"
    subprocess.run(
        [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-gnu", "-O2",
         "-o", str(deploy), str(ROOT / "examples" / "deploy" / "deploy.c")],
        check=True, capture_output=True,
    )  # fmt: skip
    inputs = []
    for i, array in enumerate(feed.values()):
        inputs.append(str(tmp_path / f"in{i}.npy"))
        np.save(inputs[-1], array)
    subprocess.run(
        ["qemu-aarch64", "-L", SYSROOT, str(deploy), str(library), *inputs, "-o", str(tmp_path),
         "-t", "2"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    session = polyonnx.InferenceSession(model, threads=1)
    for output, expected in zip(session.get_outputs(), want, strict=True):
        got = np.load(tmp_path / f"{output.name.replace('/', '_')}.npy")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cpu", ["haswell", "x86-64"])
def test_older_x86_libraries_run_here_and_match(cpu, tmp_path):
    feed = _feed(LENET, 2)
    want, shapes = _host_outputs(LENET, feed)
    target = make_target("x86_64-linux-gnu", cpu)
    library = compile_library(LENET, tmp_path, "net", target=target, input_shapes=shapes).library
    got = polyonnx.InferenceSession(library, threads=2).run(None, feed)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_missing_cross_linker_says_what_to_install(monkeypatch):
    from polyonnx.emit import toolchain

    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    monkeypatch.setattr(toolchain.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(polyonnx.CodegenError, match=r'pip install "polyonnx\[cross\]"'):
        toolchain.find_toolchain("aarch64-linux-gnu")


def test_half_floats_jit_compiled_without_f16c(tmp_path):
    """x86-64 baseline code converts float16 through the compiler runtime's helpers."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [37])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [37])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    target = make_target("x86_64-linux-gnu", "x86-64")
    session = polyonnx.InferenceSession(model, target=target)
    x = np.random.default_rng(0).standard_normal(37).astype(np.float32) * 100
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x.astype(np.float16))
