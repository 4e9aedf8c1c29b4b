"""Tuning records on parametric code: a record measured on a kernel at the sizes of a
session's first run (a sequence of 128) schedules that kernel's parametric code, with the
record's micro-kernel parameters, at every size; a record for other sizes does not."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import supported_ops
from polyonnx.runtime.compiled import POISON, default_schedules, lower_model
from polyonnx.runtime.parametric import ParametricModel
from polyonnx.runtime.session import InferenceSession
from polyonnx.schedule.gemm import Params, is_ukernel_mark
from polyonnx.tune.apply import Records
from polyonnx.tune.db import Database, Key, Trial
from polyonnx.tune.tasks import structural_hash
from tests.helpers import assert_matches
from tests.runtime.test_parametric import CASES

TUNED_AT = 128
PARAMS = {"mr": 8, "nr": 32, "kc": 16, "mc": 32, "nc": 64, "unroll": 1, "split": "none",
          "packa": 0, "packb": 0}  # fmt: skip
"""Not the default's parameters for any of the attention case's GEMMs."""


def _record(model, kernel_name: str) -> tuple[str, list[Trial]]:
    """The task of ``kernel_name`` at S = TUNED_AT, a default trial and a record for it
    with PARAMS, twice as fast."""
    graph = load_graph(model, supported_ops=supported_ops())
    shapes = {v.name: [TUNED_AT if d == "S" else d for d in v.shape] for v in graph.inputs}
    program = lower_model(model, shapes)
    defaults = default_schedules(program)
    index = [k.name for k in program.kernels].index(kernel_name)
    task = structural_hash(program.kernels[index], program, defaults[index])
    key = Key.host(1)
    trace = [{"kernel": kernel_name, "primitive": "ukernel", "args": {"params": PARAMS}}]
    make = lambda trace, median: Trial(task, "MatMul", kernel_name, trace, "ok", None,  # noqa: E731
                                       median, 0.0, 5, key, baseline_s=1e-3)  # fmt: skip
    return task, [make([], 1e-3), make(trace, 0.5e-3)]


def _ukernel_params(schedule) -> list[Params]:
    return [Params.from_mark(m) for ms in schedule.state.marks.values() for m in ms
            if is_ukernel_mark(m)]  # fmt: skip


@pytest.fixture
def records(tmp_path):
    case = CASES["attention"]()
    _, trials = _record(case.model, "o3")
    with Database(tmp_path / "tuning.db") as db:
        for t in trials:
            db.add(t)
        yield case, Records(Key.host(1), [db])


def test_a_record_at_the_first_runs_sizes_schedules_every_size(records, monkeypatch):
    monkeypatch.setenv(POISON, "1")
    case, found = records
    session = InferenceSession(case.model, threads=1, cache=False, records=found)
    reference = onnxruntime.InferenceSession(case.model.SerializeToString())
    for s in (TUNED_AT, 1, 7, 130, 300):
        feed = case.feed(s, s)
        assert_matches(session.run(None, feed)[0], reference.run(None, feed)[0], case.tol(s))
    model = session._parametric
    assert isinstance(model, ParametricModel) and session.compile_count == 1
    assert "o3" in model.tuned
    schedule = next(s for s in model.schedules if s.kernel.name == "o3")
    (params,) = _ukernel_params(schedule)
    tuned = (params.mr, params.nr, params.kc, params.mc, params.nc)
    assert tuned == (8, 32, 16, 32, 64)
    untuned = next(s for s in model.schedules if s.kernel.name not in model.tuned and s.gemms)
    assert all((p.mr, p.nr, p.kc, p.mc, p.nc) != tuned for p in _ukernel_params(untuned))


def test_a_record_at_other_sizes_does_not_apply(records):
    case, found = records
    session = InferenceSession(case.model, threads=1, cache=False, records=found)
    feed = case.feed(17, 0)
    session.run(None, feed)
    assert isinstance(session._parametric, ParametricModel)
    assert session._parametric.tuned == ()
    np.testing.assert_allclose(
        session.run(None, feed)[0],
        onnxruntime.InferenceSession(case.model.SerializeToString()).run(None, feed)[0],
        rtol=2e-4, atol=2e-4,
    )  # fmt: skip
