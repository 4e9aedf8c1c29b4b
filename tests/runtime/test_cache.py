"""The compile cache: a second session loads what the first compiled, a damaged entry is
compiled again, processes share it, and it stays under its cap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyonnx
from polyonnx.cli import main as cli
from polyonnx.runtime import session as session_module
from polyonnx.runtime.cache import CompileCache

MLP = Path(__file__).resolve().parents[2] / "examples" / "mlp.onnx"


def _relu(n: int):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        f"relu{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 40])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _feed(seed: int = 0) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((8, 784)).astype(np.float32)}


def test_second_session_loads_without_compiling(tmp_path, monkeypatch):
    first = polyonnx.InferenceSession(MLP, cache=tmp_path)
    want = first.run(None, _feed())
    assert len(CompileCache(tmp_path).entries()) == 1

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled although the cache holds the model")

    monkeypatch.setattr(session_module, "compile_graph", no_compiling)
    second = polyonnx.InferenceSession(MLP, cache=tmp_path)
    assert second.compiled_for(_feed()).cached
    np.testing.assert_array_equal(second.run(None, _feed())[0], want[0])


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_entry_is_compiled_again(tmp_path, damage):
    polyonnx.InferenceSession(MLP, cache=tmp_path)
    (entry,) = CompileCache(tmp_path).entries()
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) - 100] ^= 0x40  # a weight's bit
    entry.write_bytes(bytes(data))
    session = polyonnx.InferenceSession(MLP, cache=tmp_path)
    assert not session.compiled_for(_feed()).cached
    want = polyonnx.InferenceSession(MLP, cache=False).run(None, _feed())
    np.testing.assert_array_equal(session.run(None, _feed())[0], want[0])
    assert polyonnx.InferenceSession(MLP, cache=tmp_path).compiled_for(_feed()).cached


def test_key_covers_shapes_and_profiling(tmp_path):
    polyonnx.InferenceSession(_relu(3), cache=tmp_path)
    polyonnx.InferenceSession(_relu(5), cache=tmp_path)
    polyonnx.InferenceSession(_relu(3), cache=tmp_path, profile=True)
    assert len(CompileCache(tmp_path).entries()) == 3
    session = polyonnx.InferenceSession(_relu(3), cache=tmp_path, profile=True)
    x = np.ones((3, 40), np.float32)
    session.run(None, {"x": x})
    assert session.compiled_for({"x": x}).cached
    assert session.kernel_profile()[0].calls == 1


def test_processes_compiling_at_once_all_succeed(tmp_path):
    script = (
        "import sys, numpy as np, polyonnx\n"
        f"s = polyonnx.InferenceSession({str(MLP)!r}, cache={str(tmp_path)!r})\n"
        "x = np.ones((8, 784), np.float32)\n"
        "print(float(s.run(None, {'input': x})[0].sum()))\n"
    )
    env = {**os.environ, "POLYONNX_CACHE": "on"}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert len(set(outputs)) == 1
    assert len(CompileCache(tmp_path).entries()) == 1
    assert not list(tmp_path.glob(".tmp-*"))


def test_least_recently_used_entries_go_past_the_cap(tmp_path):
    for n in (3, 5):
        polyonnx.InferenceSession(_relu(n), cache=tmp_path)
    cache = CompileCache(tmp_path)
    sizes = sorted(p.stat().st_size for p in cache.entries())
    older = min(cache.entries(), key=lambda p: p.stat().st_mtime_ns)
    os.utime(older, ns=(1, 1))
    newest = max(cache.entries(), key=lambda p: p.stat().st_mtime_ns)
    CompileCache(tmp_path, cap=sizes[-1] + 1).evict()
    assert cache.entries() == [newest]


def test_cache_command_reports_and_clears(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLYONNX_CACHE_DIR", str(tmp_path))
    polyonnx.InferenceSession(_relu(3), cache=True)
    assert cli(["cache", "info"]) == 0
    assert "entries  1," in capsys.readouterr().out
    assert cli(["cache", "clear"]) == 0
    assert CompileCache(tmp_path).entries() == []


def test_unwritable_cache_directory_still_compiles(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    session = polyonnx.InferenceSession(_relu(3), cache=blocked / "cache")
    x = np.full((3, 40), -1.0, np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.zeros_like(x))


def test_changed_external_data_is_a_new_key(tmp_path):
    """The key hashes the bytes on disk, the weights' file beside the model too."""
    import shutil

    from polyonnx.frontend.load import model_digest

    source = Path(__file__).resolve().parents[2] / "tests" / "data" / "torch"
    for name in ("resnet_dynamo.onnx", "resnet_dynamo.data"):
        shutil.copy(source / name, tmp_path / name)
    model = tmp_path / "resnet_dynamo.onnx"
    before = model_digest(model)
    data = bytearray((tmp_path / "resnet_dynamo.data").read_bytes())
    data[-1] ^= 1
    (tmp_path / "resnet_dynamo.data").write_bytes(bytes(data))
    assert model_digest(model) != before
    assert model_digest(model) == model_digest(str(model))
