"""The polyonnx command: run and show as a newcomer types them."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from polyonnx import cli
from polyonnx.cli import main
from polyonnx.target import host_target

EXAMPLE = str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "mlp.onnx")


def test_run_prints_outputs_and_latency(capsys):
    assert main(["run", EXAMPLE, "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "input    input: float32 [8, 784]" in out
    assert "output   probs: float32 [8, 10]" in out
    assert "latency" in out and "median of 2" in out
    # the arena, and the 784x512 and 512x256 weights packed once (the originals not kept)
    assert "memory   intermediates 0.02 MB (at least 0.02 MB live at once)" in out
    assert "constants 2.04 MB (2.03 MB of them weights packed for GEMMs" in out


def test_run_compare_ort_reports_small_errors(capsys):
    pytest.importorskip("onnxruntime")
    assert main(["run", EXAMPLE, "--repeat", "2", "--compare-ort"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("output   probs"))
    rel = float(line.split("max rel err ")[1].split()[0])
    assert rel < 1e-4
    assert "onnxruntime latency" in out


def test_run_with_input_file(tmp_path, capsys):
    x = np.zeros((8, 784), np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", EXAMPLE, "--input", f"input={tmp_path / 'x.npy'}", "--repeat", "1"]) == 0
    assert "output   probs" in capsys.readouterr().out


def test_run_with_wrong_input_file_is_a_clear_error(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((8, 783), np.float32))
    assert main(["run", EXAMPLE, "--input", f"input={tmp_path / 'x.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "input 'input'" in err and "784" in err and "783" in err


def test_run_missing_model_is_a_clear_error(capsys):
    assert main(["run", "no/such/model.onnx"]) == 2
    assert "no/such/model.onnx" in capsys.readouterr().err


def test_show_prints_domains_accesses_and_loop_nest(capsys):
    assert main(["show", EXAMPLE, "--kernel", "fc0"]) == 0
    out = capsys.readouterr().out
    assert "=== kernel fc0 (Gemm) ===" in out
    assert "S1: domain { S1[i, j, k] : 0 <= i < 8 and 0 <= j < 512 and 0 <= k < 784 }" in out
    assert "read  w0: { S1[i, j, k] -> [k, j] }" in out
    assert "relu0[i_g][j_g] = b0[j_g];" in out  # the bias init, in the register tile
    # the default runs the Gemm as packed GEMM with an 8 x 32 register tile (AVX-512; with
    # AVX2's 16 registers 4 x 16, two whole tiles for the 8 rows)
    lanes = host_target().lanes()
    tile = "mr8_nr32_kc800" if lanes >= 16 else f"mr4_nr{2 * lanes}_kc416"
    assert f"#pragma ukernel_{tile}" in out  # K = 784: one block (AVX-512), two (AVX2)
    assert "for (int k_g = 0; k_g <= 783; k_g++)" in out
    # the Relu after it is its epilogue, computed on the register tile before the store
    assert "relu0[i_g][j_g] += (input[i_g][k_g] * w0[k_g][j_g]);" in out
    assert "relu0[i_g][j_g] = max(relu0[i_g][j_g], 0.0);" in out
    assert "=== kernel relu0" not in out


def test_show_all_kernels_and_llvm(capsys):
    assert main(["show", EXAMPLE, "--llvm"]) == 0
    out = capsys.readouterr().out
    for name in ("fc0", "fc1", "fc2", "softmax"):  # each Relu is its Gemm's epilogue
        assert f"=== kernel {name} " in out
    assert f"<{host_target().lanes()} x float>" in out and "define" in out


def test_show_unknown_kernel_lists_the_known_ones(capsys):
    assert main(["show", EXAMPLE, "--kernel", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "fc0" in err and "softmax" in err


def test_compare_ort_counts_nan_in_the_same_places_apart(tmp_path, capsys):
    """A fully masked sequence gives NaN in both runtimes (the encoder's softmax over no
    keys): agreement, reported as such, with the error taken over the other elements."""
    model = pathlib.Path(__file__).resolve().parent / "data" / "torch" / "encoder_dynamo.onnx"
    x = np.random.default_rng(0).standard_normal((2, 10, 32)).astype(np.float32)
    mask = np.zeros((2, 10), dtype=bool)
    mask[0] = True  # the first sequence masked whole: its 320 outputs are NaN
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "mask.npy", mask)
    feed = ["--input", f"x={tmp_path / 'x.npy'}", "--input", f"mask={tmp_path / 'mask.npy'}"]
    assert main(["run", str(model), *feed, "--compare-ort", "--repeat", "1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("output"))
    assert "NaN in the same 320 places" in line, line
    assert float(line.split("max abs err ")[1].split()[0]) < 1e-4, line


# ---- bad arguments: one clean line, exit code 2 -------------------------------------------

TRACEBACK = "Traceback (most recent call last)"


def _bad_arguments(tmp_path: pathlib.Path) -> list[tuple[list[str], str]]:
    """(argv, what stderr's last line says) for every class of bad argument."""
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "file").write_text("x")
    junk, empty, file = (str(tmp_path / n) for n in ("junk.npy", "empty.onnx", "file"))
    return [
        (["run", "no/such/model.onnx"], "polyonnx: error: model file not found"),
        (["run", str(tmp_path)], "polyonnx: error: the model path .* is a directory"),
        (["run", empty], "polyonnx: error: .*empty.onnx"),
        (["run", EXAMPLE, "--shape", "input=a,b"], "argument --shape: expected NAME=D0,D1"),
        (["run", EXAMPLE, "--shape", "input"], "argument --shape: expected NAME=D0,D1"),
        (["run", EXAMPLE, "--shape", "input=-1,784"], "argument --shape: expected NAME="),
        (["run", EXAMPLE, "--shape", "input=8,784,1"], "polyonnx: error: --shape input=8,784,1"),
        (["run", EXAMPLE, "--shape", "nope=1"], r"polyonnx: error: --shape names \['nope'\]"),
        (["run", EXAMPLE, "--threads", "0"], "argument --threads: expected a positive integer"),
        (["run", EXAMPLE, "--threads", "-1"], "argument --threads: expected a positive integer"),
        (["run", EXAMPLE, "--threads", "x"], "argument --threads: expected a positive integer"),
        (["run", EXAMPLE, "--threads", "99999"], "argument --threads: expected at most"),
        (["run", EXAMPLE, "--repeat", "0"], "argument --repeat: expected a positive integer"),
        (["run", EXAMPLE, "--seed", "-1"], "argument --seed: expected a non-negative"),
        (["run", EXAMPLE, "--input", "input=missing.npy"], "argument --input: no such file"),
        (["run", EXAMPLE, "--input", f"input={junk}"], "polyonnx: error: --input input=.*npy"),
        (["run", EXAMPLE, "--db", str(tmp_path)], "polyonnx: error: tuning_db must name a file"),
        (["profile", EXAMPLE, "--runs", "0"], "argument --runs: expected a positive integer"),
        (["profile", EXAMPLE, "--top", "x"], "argument --top: expected a positive integer"),
        (["show", EXAMPLE, "--shape", "input=8,783"], "polyonnx: error: input 'input'.*783"),
        (["tune", EXAMPLE, "--budget", "soon"], "polyonnx: error: --budget takes a time"),
        (["compile", EXAMPLE, "-o", file], "polyonnx: error: -o .*cannot create the directory"),
        (["compile", EXAMPLE, "-o", str(tmp_path), "--target", "vax"], "polyonnx: error: target"),
        (["compile", EXAMPLE, "-o", str(tmp_path), "--threads", "0"], "argument --threads"),
        (["cache", "bogus"], "argument action: invalid choice"),
        (["frobnicate"], "invalid choice"),
    ]


def test_every_bad_argument_is_one_clean_line_and_exit_code_2(tmp_path, capsys):
    for argv, message in _bad_arguments(tmp_path):
        plain = argv[0] == "run" and "--db" not in argv  # the shipped records: not tested
        assert main([*argv, "--no-tuning"] if plain else argv) == 2, argv
        err = capsys.readouterr().err
        assert TRACEBACK not in err, (argv, err)
        last = err.strip().splitlines()[-1]
        assert re.search(message, last), (argv, err)
        assert last.startswith("polyonnx"), (argv, err)


def test_a_multi_line_error_is_printed_as_one_line(monkeypatch, capsys):
    from polyonnx.errors import UnsupportedOpError

    def unsupported(args):
        raise UnsupportedOpError({"Foo": ["a", "b"], "Bar": ["c"]})

    monkeypatch.setattr(cli, "cmd_cache", unsupported)
    assert main(["cache", "info"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("polyonnx: error: the model uses 2 unsupported operator type(s): Bar")
    assert "Foo: node(s) 'a', 'b'" in err


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only deliberate errors are made clean: anything else is a bug and must show."""

    def bug(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "cmd_cache", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["cache", "info"])


def _polyonnx(*argv: str, code: str = "") -> subprocess.CompletedProcess:
    """``polyonnx argv`` in a fresh process (``code`` runs first, to inject a fault)."""
    script = f"import sys, polyonnx.cli as cli\n{code}\nsys.exit(cli.main(sys.argv[1:]))"
    env = {**os.environ, "POLYONNX_CACHE": "off"}
    return subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "no/such/model.onnx"], "polyonnx: error: model file not found"),
        (["run", EXAMPLE, "--threads", "0"], "argument --threads: expected a positive integer"),
        (["run", EXAMPLE, "--shape", "input=1,x"], "argument --shape: expected NAME=D0,D1"),
        (["tune", EXAMPLE, "--budget=-5m"], "polyonnx: error: --budget takes a time"),
    ],
)
def test_bad_arguments_in_a_fresh_process(argv, message):
    done = _polyonnx(*argv)
    assert done.returncode == 2, done.stderr
    assert TRACEBACK not in done.stderr
    assert re.search(message, done.stderr.strip().splitlines()[-1]), done.stderr
    assert done.stdout == ""


def test_ctrl_c_exits_130_quietly():
    """SIGINT in the middle of a command: no traceback, exit code 130."""
    fault = "import os, signal\ncli.cmd_cache = lambda args: os.kill(os.getpid(), signal.SIGINT)"
    done = _polyonnx("cache", "info", code=fault)
    assert done.returncode == 130, done.stderr
    assert done.stderr == ""
