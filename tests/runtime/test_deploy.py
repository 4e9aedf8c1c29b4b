"""The C side of a library: examples/deploy/deploy.c prints and writes what
InferenceSession gives, bit for bit, and a C program linking the library directly gets
a status and a message for every wrong call."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import polyonnx
from polyonnx.runtime.library import compile_library
from tests.runtime.test_library import batch_feed, batch_model
from tests.runtime.test_parametric_library import two_ports

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


@pytest.mark.parametrize("kind", ["batch", "parametric"])
def test_deploy_takes_symbolic_dims_from_npy_files(deploy, kind, tmp_path):
    """A library of a batch, and a parametric one, at two sizes each: the same as the
    session, the inputs' dims read off their .npy files."""
    model = batch_model() if kind == "batch" else two_ports().model
    library = compile_library(model, tmp_path, kind).library
    session = polyonnx.InferenceSession(library)
    for size in (3, 17):
        feed = batch_feed(size) if kind == "batch" else two_ports().feed(size, size)
        paths = []
        for name, array in feed.items():
            paths.append(tmp_path / f"{name}.npy")
            np.save(paths[-1], array)
        out = tmp_path / f"out{size}"
        out.mkdir()
        subprocess.run([str(deploy), str(library), *map(str, paths), "-o", str(out)],
                       check=True, capture_output=True)  # fmt: skip
        for port, want in zip(session.get_outputs(), session.run(None, feed), strict=True):
            np.testing.assert_array_equal(np.load(out / f"{port.name}.npy"), want)


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


BATCH_CHECKS = r"""
/* Links libbatch.so (tests/runtime/test_library.py's batch_model) and runs it at several
 * batch sizes, writing DIR/OUTPUT_N.bin, then calls it the wrong ways. */
#include <stdio.h>
#include <stdlib.h>

#include "batch.h"

static float *filled(size_t count, int seed) {
    float *x = malloc((count + 1) * sizeof *x);
    for (size_t i = 0; i < count; i++) x[i] = (float)((i * 7 + (size_t)seed) % 13) * 0.25f - 1.5f;
    return x;
}

static int run(batch_session *s, const char *dir, int64_t n, size_t shrink) {
    int64_t da[] = {n, 4, 5}, dc[] = {3, n, 2}, dw[] = {2, 2};
    const int64_t *dims[] = {da, da, dc, dw};
    const void *in[] = {filled(n * 20, 0), filled(n * 20, 1), filled(n * 6, 2), filled(4, 3)};
    void *out[5];
    size_t bytes[5];
    for (int i = 0; i < 5; i++) {
        int64_t d[3];
        size_t count = 1;
        batch_output_dims_for(i, n, d);
        for (int k = 0; k < batch_output_rank(i); k++) count *= (size_t)d[k];
        bytes[i] = count * sizeof(float) - (i == 2 ? shrink : 0);
        out[i] = malloc(count * sizeof(float) + 1);
    }
    int status = batch_run(s, in, dims, out, bytes);
    const char *small = shrink ? " small" : "";
    printf("run %lld%s: %d %s\n", (long long)n, small, status, batch_error(s));
    int64_t v[2];
    batch_run_output_dims(s, 2, v);
    printf("dims of v %lld%s: %lld %lld\n", (long long)n, small, (long long)v[0], (long long)v[1]);
    for (int i = 0; i < 5 && !status; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%d_%lld.bin", dir, i, (long long)n);
        FILE *f = fopen(path, "wb");
        fwrite(out[i], 1, bytes[i], f);
        fclose(f);
    }
    for (int i = 0; i < 5; i++) free(out[i]);
    for (int i = 0; i < 4; i++) free((void *)in[i]);
    return status;
}

int main(int argc, char **argv) {
    batch_session *s = batch_open(2);
    if (!s || argc < 2) return 1;
    const int64_t *c = batch_input_dims(2);
    printf("batch %s, c's dims %lld %lld %lld\n", batch_batch_name(), (long long)c[0],
           (long long)c[1], (long long)c[2]);
    int64_t v[2];
    batch_run_output_dims(s, 2, v);
    printf("dims of v before: %lld %lld\n", (long long)v[0], (long long)v[1]);
    run(s, argv[1], 2, 0);
    run(s, argv[1], 5, 0);
    run(s, argv[1], 0, 0);
    run(s, argv[1], 2, 4);
    float x[3 * 20] = {0}, y[3 * 20];
    int64_t three[] = {3, 4, 5}, two[] = {2, 4, 5}, c3[] = {3, 3, 2}, w[] = {2, 2};
    const void *in[] = {x, x, x, x};
    void *out[] = {y, y, y, y, y};
    size_t bytes[] = {sizeof y, sizeof y, sizeof y, sizeof y, sizeof y};
    const int64_t *mixed[] = {three, two, c3, w};
    printf("mixed: %d %s\n", batch_run(s, in, mixed, out, bytes), batch_error(s));
    printf("no dims: %d %s\n", batch_run(s, in, NULL, out, bytes), batch_error(s));
    batch_close(s);
    return 0;
}
"""


def _filled(shape, seed: int) -> np.ndarray:
    """What BATCH_CHECKS's filled() makes: exact float32 values."""
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    return (((i * 7 + seed) % 13) * 0.25 - 1.5).astype(np.float32).reshape(shape)


def test_c_program_runs_a_batch_library_at_any_batch_size(tmp_path):
    compile_library(batch_model(), tmp_path, "batch")
    source = tmp_path / "batch_checks.c"
    source.write_text(BATCH_CHECKS)
    program = tmp_path / "batch_checks"
    subprocess.run(
        [CC, "-O2", "-Wall", "-I", str(tmp_path), "-o", str(program), str(source),
         "-L", str(tmp_path), "-lbatch", f"-Wl,-rpath,{tmp_path}"],
        check=True,
    )  # fmt: skip
    lines = subprocess.run([str(program), str(tmp_path)], capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    report = dict(line.split(": ", 1) for line in lines.splitlines() if ": " in line)
    assert "batch N, c's dims 3 -1 2" in lines
    assert report["dims of v before"] == "-1 2"
    for n in (2, 5, 0):
        assert report[f"run {n}"].strip() == "0"
        assert report[f"dims of v {n}"] == f"{3 * n} 2"
    assert report["run 2 small"].startswith(
        "3 output 2 'v': the buffer has 44 bytes, the output needs 48 (dims [6, 2]"
    )
    assert report["dims of v 2 small"] == "0 2"  # the last run whose checks passed
    assert report["mixed"] == (
        "2 input 1 'b': dim 0 is the symbolic size 'N', which input 0 'a' gave as 3; here it is 2"
    )
    assert report["no dims"] == "2 input 0 'a' has a symbolic dim: give input_dims"
    reference = ort.InferenceSession(batch_model().SerializeToString())
    outputs = [o.name for o in reference.get_outputs()]
    for n in (2, 5, 0):
        shapes = {"a": (n, 4, 5), "b": (n, 4, 5), "c": (3, n, 2), "w": (2, 2)}
        feed = {name: _filled(shape, seed) for seed, (name, shape) in enumerate(shapes.items())}
        for i, want in enumerate(reference.run(None, feed)):
            got = np.fromfile(tmp_path / f"{i}_{n}.bin", np.float32).reshape(want.shape)
            np.testing.assert_array_equal(got, want, err_msg=f"{outputs[i]} at {n} samples")
