"""Search spaces: every point's trace replays to the point; every candidate the schedule
API accepts computes what numpy computes, on odd shapes too (1, primes, non-multiples of
the vector width and of the tile sizes)."""

from __future__ import annotations

import random

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from polyonnx.runtime.compiled import lower_model
from polyonnx.tune.runner import Bench
from polyonnx.tune.space import genome_of, space_for

DIMS = st.sampled_from([1, 3, 7, 16, 17, 31, 33, 64])


def matmul_model(tmp_path, m: int, k: int, n: int, batch: int = 0) -> str:
    lead = [batch] if batch else []
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")],
        "mm",
        [
            helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [*lead, m, k]),
            helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [*lead, k, n]),
        ],
        [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [*lead, m, n])],
    )
    model = helper.make_model(
        graph, ir_version=10, opset_imports=[helper.make_operatorsetid("", 17)]
    )
    path = tmp_path / f"mm_{batch}_{m}_{k}_{n}.onnx"
    onnx.save(model, path)
    return str(path)


def test_points_round_trip_through_their_traces(model_path):
    program = lower_model(model_path)
    rng = random.Random(0)
    for name in ("mm1", "concat", "softmax"):
        space = space_for(program.kernel(name), program.buffers, threads=2, lanes=16)
        for genome in [space.default] + [space.sample(rng) for _ in range(30)]:
            trace = space.trace(genome)  # points that differ only in unused knobs share one
            assert space.trace(genome_of(space, trace)) == trace


def test_gemm_space_holds_the_default_and_real_choices(model_path):
    program = lower_model(model_path)
    space = space_for(program.kernel("mm1"), program.buffers, threads=2, lanes=16)
    assert space.kind == "gemm"
    assert space.knobs["split"] == ("none", "rows", "cols")
    assert all(space.default[k] in v for k, v in space.knobs.items())
    one_thread = space_for(program.kernel("mm1"), program.buffers, threads=1, lanes=16)
    assert one_thread.knobs["split"] == ("none",)


@settings(max_examples=8, deadline=None)
@given(m=DIMS, k=DIMS, n=DIMS, batch=st.sampled_from([0, 3]), seed=st.integers(0, 1 << 30))
def test_candidates_compute_what_numpy_computes(tmp_path_factory, m, k, n, batch, seed):
    path = matmul_model(tmp_path_factory.mktemp("mm"), m, k, n, batch)
    program = lower_model(path)
    bench = Bench(program, "mm", threads=2)
    a, b = bench.inputs["a"], bench.inputs["b"]
    np.testing.assert_allclose(bench.reference()["c"], a @ b, rtol=1e-4, atol=1e-4)
    space = space_for(program.kernel("mm"), program.buffers, threads=2, lanes=16)
    rng = random.Random(seed)
    for genome in [space.sample(rng) for _ in range(3)] + [space.mutate(space.default, rng)]:
        result = bench.measure(space.trace(genome), min_seconds=0.0)
        # Illegal points are refused with a reason; legal ones must match the default.
        assert result.status == "ok" or result.reason.startswith("illegal"), result.reason
