"""A library of a model whose symbolic dims are not a batch: one parametric entry
(capi/parametric.c) for every size, sized and planned per size in C. Each case of
tests/runtime/test_parametric.py that compiles parametric runs sequences of sizes
through one library session against onnxruntime, with its arena poisoned; a C program
linking a library gets the outputs and a status and message for each wrong call."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnxruntime
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx
from polyonnx.errors import InputError
from polyonnx.runtime.compiled import POISON
from polyonnx.runtime.library import LibraryModel, compile_library
from tests.helpers import assert_matches, fast
from tests.runtime.test_parametric import CASES, PARAMETRIC, SIZES, F, case, node

CC = shutil.which("cc") or shutil.which("gcc")
LIBRARY_CASES = [name for name, make in CASES.items() if make().expect == PARAMETRIC]


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """name -> (case, library session, onnxruntime session), compiled on first use; the
    sessions open with POLYONNX_POISON_ARENA=1 (the C runtime reads it at open)."""
    made: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(POISON, "1")

        def get(name: str):
            if name not in made:
                case_ = CASES[name]()
                path = compile_library(case_.model, tmp_path_factory.mktemp(name), name).library
                reference = onnxruntime.InferenceSession(
                    case_.model.SerializeToString(), providers=["CPUExecutionProvider"]
                )
                made[name] = (case_, polyonnx.InferenceSession(path, threads=2), reference)
            return made[name]

        yield get


def test_every_parametric_case_is_run_here():
    assert {"attention", "matmul_contraction", "softmax", "reductions"} <= set(LIBRARY_CASES)


@pytest.mark.parametrize("name", LIBRARY_CASES)
@fast(max_examples=6)
@given(sizes=SIZES, seed=st.integers(0, 2**16))
def test_a_parametric_library_runs_every_size(libraries, name, sizes, seed):
    case_, session, reference = libraries(name)
    for s in (1, *sizes):
        feed = case_.feed(s, seed)
        assert isinstance(session.runner_for(feed), LibraryModel)
        want = reference.run(None, feed)
        for i, (got, expected) in enumerate(zip(session.run(None, feed), want, strict=True)):
            try:
                assert_matches(got, expected, case_.tol(s))
            except AssertionError as exc:
                raise AssertionError(f"output {i} at S={s}: {exc}") from None
    assert session.compile_count == 0


def two_ports():
    """a, b [S, 4]: y = Concat(a + b, a) [2S, 4] and z = a^T b [4, 4], which sums over S
    (so S is not a batch)."""
    return case(
        [
            node("Add", ["a", "b"], ["c"]),
            node("Concat", ["c", "a"], ["y"], axis=0),
            node("Transpose", ["a"], ["at"], perm=[1, 0]),
            node("MatMul", ["at", "b"], ["z"]),
        ],
        {"a": (("S", 4), F), "b": (("S", 4), F)},
        {"y": (("2S", 4), F), "z": ((4, 4), F)},
    )


def test_the_header_and_ports_show_the_symbols(tmp_path):
    written = compile_library(two_ports().model, tmp_path, "seq")
    header = written.header.read_text()
    assert "input  0: a float32 [-1, 4]" in header
    assert "output 'y': [2*S, 4]" in header
    assert "int seq_output_dims_at(int i, const int64_t *values, int64_t *dims);" in header
    model = LibraryModel(written.library, 1)
    assert model.symbols == ("S",) and model.batch is None
    assert [p.shape for p in model.inputs] == [("S", 4), ("S", 4)]


def test_a_library_refuses_what_it_cannot_size(tmp_path):
    """A model that is not parametric (where a Concat part starts depends on S) asks for
    --shape and says why; so does a parametric library for another target."""
    with pytest.raises(InputError, match=r"--shape.*not parametric: where part .* starts"):
        compile_library(CASES["slice_into_concat"]().model, tmp_path, "nope")
    from polyonnx.target import make_target

    other = make_target("aarch64-unknown-linux-gnu", None)
    with pytest.raises(InputError, match=r"--shape.*for the host only"):
        compile_library(two_ports().model, tmp_path, "arm", target=other)


def test_compile_command_needs_no_shape_for_a_sequence(tmp_path, capsys):
    from polyonnx.cli import main as cli

    model = tmp_path / "seq.onnx"
    model.write_bytes(two_ports().model.SerializeToString())
    assert cli(["compile", str(model), "-o", str(tmp_path / "out")]) == 0
    assert "wrote" in capsys.readouterr().out
    session = polyonnx.InferenceSession(tmp_path / "out" / "libseq.so")
    a, b = np.ones((5, 4), F), np.full((5, 4), 2, F)
    y, z = session.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(y, np.concatenate([a + b, a]))
    np.testing.assert_array_equal(z, a.T @ b)


PARAMETRIC_CHECKS = r"""
/* Links libseq.so (two_ports) and runs it at several sizes of S, writing DIR/OUTPUT_S.bin,
 * then calls it the wrong ways. */
#include <stdio.h>
#include <stdlib.h>

#include "seq.h"

static float *filled(size_t count, int seed) {
    float *x = malloc((count + 1) * sizeof *x);
    for (size_t i = 0; i < count; i++) x[i] = (float)((i * 7 + (size_t)seed) % 13) * 0.25f - 1.5f;
    return x;
}

static int run(seq_session *s, const char *dir, int64_t n, int64_t m, size_t shrink) {
    int64_t da[] = {n, 4}, db[] = {m, 4}, values[] = {n};
    const int64_t *dims[] = {da, db};
    const void *in[] = {filled((size_t)n * 4, 0), filled((size_t)m * 4, 1)};
    void *out[2];
    size_t bytes[2];
    for (int i = 0; i < 2; i++) {
        int64_t d[2] = {0, 0};
        seq_output_dims_at(i, values, d);
        bytes[i] = (size_t)(d[0] * d[1]) * sizeof(float) - (i == 0 ? shrink : 0);
        out[i] = malloc((size_t)(d[0] * d[1] + 1) * sizeof(float));
    }
    int status = seq_run(s, in, dims, out, bytes);
    printf("run %lld %lld %zu: %d %s\n", (long long)n, (long long)m, shrink, status, seq_error(s));
    int64_t y[2];
    seq_run_output_dims(s, 0, y);
    printf("dims of y %lld %lld %zu: %lld %lld\n", (long long)n, (long long)m, shrink,
           (long long)y[0], (long long)y[1]);
    for (int i = 0; i < 2 && !status; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%d_%lld.bin", dir, i, (long long)n);
        FILE *f = fopen(path, "wb");
        fwrite(out[i], 1, bytes[i], f);
        fclose(f);
    }
    for (int i = 0; i < 2; i++) free(out[i]), free((void *)in[i]);
    return status;
}

int main(int argc, char **argv) {
    seq_session *s = seq_open(2);
    if (!s || argc < 2) return 1;
    printf("symbols %d %s %d %d, a's dims %lld %lld, batch %s\n", seq_symbol_count(),
           seq_symbol_name(0), seq_input_symbol(0, 0), seq_input_symbol(0, 1),
           (long long)seq_input_dims(0)[0], (long long)seq_input_dims(0)[1],
           seq_batch_name() ? seq_batch_name() : "none");
    int64_t y[2], zero[] = {0};
    seq_run_output_dims(s, 0, y);
    printf("dims of y before: %lld %lld\n", (long long)y[0], (long long)y[1]);
    printf("dims at 0: %d\n", seq_output_dims_at(0, zero, y));
    run(s, argv[1], 3, 3, 0);
    run(s, argv[1], 130, 130, 0);
    run(s, argv[1], 1, 1, 0);
    run(s, argv[1], 3, 2, 0);
    run(s, argv[1], 0, 0, 0);
    run(s, argv[1], 4, 4, 4);
    float x[8] = {0}, out[8];
    const void *in[] = {x, x};
    void *outs[] = {out, out};
    size_t bytes[] = {sizeof out, sizeof out};
    int64_t wrong[] = {2, 5};
    const int64_t *dims[] = {wrong, wrong};
    printf("no dims: %d %s\n", seq_run(s, in, NULL, outs, bytes), seq_error(s));
    printf("wrong dims: %d %s\n", seq_run(s, in, dims, outs, bytes), seq_error(s));
    seq_close(s);
    return 0;
}
"""


def _filled(shape, seed: int) -> np.ndarray:
    """What PARAMETRIC_CHECKS's filled() makes: exact float32 values."""
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    return (((i * 7 + seed) % 13) * 0.25 - 1.5).astype(np.float32).reshape(shape)


@pytest.mark.skipif(CC is None, reason="no C compiler to build the C program")
def test_c_program_runs_a_parametric_library_at_any_size(tmp_path):
    model = two_ports().model
    compile_library(model, tmp_path, "seq")
    source = tmp_path / "seq_checks.c"
    source.write_text(PARAMETRIC_CHECKS)
    program = tmp_path / "seq_checks"
    subprocess.run(
        [CC, "-O2", "-Wall", "-Werror", "-I", str(tmp_path), "-o", str(program), str(source),
         "-L", str(tmp_path), "-lseq", f"-Wl,-rpath,{tmp_path}"],
        check=True,
    )  # fmt: skip
    lines = subprocess.run([str(program), str(tmp_path)], capture_output=True, text=True,
                           check=True, env={POISON: "1"}).stdout  # fmt: skip
    report = dict(line.split(": ", 1) for line in lines.splitlines() if ": " in line)
    assert "symbols 1 S 0 -1, a's dims -1 4, batch none" in lines
    assert report["dims of y before"] == "-1 4"
    assert report["dims at 0"] == "1"
    for n in (3, 130, 1):
        assert report[f"run {n} {n} 0"].strip() == "0"
        assert report[f"dims of y {n} {n} 0"] == f"{2 * n} 4"
    assert report["run 3 2 0"] == (
        "2 inputs 0 'a' and 1 'b' give the symbolic size 'S' different values: 3 and 2"
    )
    assert report["run 0 0 0"].startswith(
        "2 input 0 'a': dim 0 is the symbolic size 'S', which must be at least 1; given 0"
    )
    assert report["run 4 4 4"].startswith(
        "3 output 0 'y': the buffer has 124 bytes, the output needs 128 (dims [8, 4]"
    )
    assert report["dims of y 0 0 0"] == "2 4"  # the last run whose checks passed
    assert report["no dims"] == "2 input 0 'a' has a symbolic dim: give input_dims"
    assert report["wrong dims"].startswith(
        "2 input 0 'a': expected dims [-1, 4] (-1: any size), given [2, 5] (dim 1 must be 4"
    )
    reference = onnxruntime.InferenceSession(model.SerializeToString())
    for n in (3, 130, 1):
        feed = {"a": _filled((n, 4), 0), "b": _filled((n, 4), 1)}
        for i, want in enumerate(reference.run(None, feed)):
            got = np.fromfile(tmp_path / f"{i}_{n}.bin", np.float32).reshape(want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5, err_msg=f"{i} at {n}")


def test_sessions_of_one_library_in_threads_at_different_sizes(tmp_path):
    """Each session plans its own arena: two threads at different sizes at once."""
    import threading

    case_ = CASES["attention"]()  # its weights are random: one model for both
    library = compile_library(case_.model, tmp_path, "att").library
    reference = onnxruntime.InferenceSession(case_.model.SerializeToString())
    errors: list[BaseException] = []

    def run(sizes) -> None:
        try:
            session = polyonnx.InferenceSession(library, threads=1)
            for s in sizes:
                feed = case_.feed(s, s)
                assert_matches(session.run(None, feed)[0], reference.run(None, feed)[0],
                               case_.tol(s))  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(sizes,)) for sizes in ((5, 64, 1), (200, 2, 33))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_sizes_too_large_are_refused_before_native_code_runs(tmp_path):
    """Dims whose tensors' bytes overflow 64 bits: status 2 and a message, nothing read
    or written (the data given is 64 bytes)."""
    import ctypes

    model = LibraryModel(compile_library(two_ports().model, tmp_path, "seq").library, 1)
    x = np.zeros((4, 4), np.float32)
    results = {}
    for s in (2**62, 2**63 - 1):
        dims = (ctypes.c_int64 * 2)(s, 4)
        given = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
        pointers = (ctypes.c_void_p * 2)(x.ctypes.data, x.ctypes.data)
        code = model._fn["run"](
            model._session, pointers, (ctypes.POINTER(ctypes.c_int64) * 2)(given, given),
            pointers, (ctypes.c_size_t * 2)(2**63, 2**63),
        )  # fmt: skip
        results[s] = (code, model._fn["error"](model._session).decode())
    for s in (2**62, 2**63 - 1):
        assert results[s] == (2, "input 0 'a': its dims are too large")
