"""The polyonnx command: run and show as a newcomer types them."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from polyonnx.cli import main
from polyonnx.target import host_target

EXAMPLE = str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "mlp.onnx")


def test_run_prints_outputs_and_latency(capsys):
    assert main(["run", EXAMPLE, "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "input    input: float32 [8, 784]" in out
    assert "output   probs: float32 [8, 10]" in out
    assert "latency" in out and "median of 2" in out
    # the arena, and the 784x512 and 512x256 weights packed once (plus the originals)
    assert "memory   intermediates 0.02 MB (at least 0.02 MB live at once)" in out
    assert "constants 4.08 MB (2.03 MB of them weights packed for GEMMs" in out


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
