"""Tasks: kernels of the same structure share one hash; a kernel runs as a program of
its own, with the same results as inside the model."""

from __future__ import annotations

import numpy as np
import onnx

from polyonnx.runtime.compiled import compile_program, default_schedules, lower_model
from polyonnx.tune.tasks import kernel_program, model_tasks, rename_trace, structural_hash


def test_identical_kernels_are_one_task(model_path):
    program = lower_model(model_path)
    tasks = model_tasks(program)
    by_op = {t.op_type: t for t in tasks}
    assert by_op["MatMul"].kernels == ("mm1", "mm2")
    assert len(tasks) == 3


def test_hash_depends_on_shapes_not_names(tmp_path, make_model):
    hashes = []
    for rows in (24, 24, 25):
        path = tmp_path / f"m{len(hashes)}.onnx"
        onnx.save(make_model(rows=rows), path)
        program = lower_model(str(path))
        hashes.append(structural_hash(program.kernel("mm1"), program))
    assert hashes[0] == hashes[1] != hashes[2]


def test_hash_changes_with_the_default_schedule(model_path):
    """Records measured against one default must not apply once the default changes."""
    program = lower_model(model_path)
    kernel = program.kernel("mm1")
    default = default_schedules(program)[[k.name for k in program.kernels].index("mm1")]
    other = default_schedules(program)[-1]  # another kernel's tree: a different default
    assert structural_hash(kernel, program) == structural_hash(kernel, program, default)
    assert structural_hash(kernel, program, other) != structural_hash(kernel, program)


def test_kernel_program_matches_the_model(model_path):
    program = lower_model(model_path)
    kernel = program.kernel("mm1")
    sub = kernel_program(program, kernel)
    assert sub.inputs == ("x",) and set(sub.constants) == {"w1", "b1"}
    assert sub.outputs == tuple(kernel.writes())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, 40)).astype(np.float32)
    got = compile_program(sub, default_schedules(sub)).run({"x": x})[sub.outputs[0]]
    w, b = program.constants["w1"], program.constants["b1"]
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_rename_trace_names_the_kernel():
    trace = [{"kernel": "mm1", "primitive": "default", "args": {}}]
    assert rename_trace(trace, "mm2") == [{"kernel": "mm2", "primitive": "default", "args": {}}]
