"""``polyonnx tune`` as a user runs it: killed with Ctrl-C (SIGINT) or SIGKILL mid-run,
then run again, it loses no trial and measures none twice; records move as JSON lines."""

from __future__ import annotations

import collections
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from polyonnx.cli import main
from polyonnx.tune.db import Database, canonical


def _command(model_path: str, db: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "polyonnx.cli", "tune", model_path, "--db", db,
            "--no-ort", "--threads", "2", *extra]  # fmt: skip


def _uids(db_path: str) -> dict[str, dict]:
    """Every trial in the database, by uid (as exported)."""
    out = io.StringIO()
    with Database(db_path) as db:
        db.export_jsonl(out)
    trials = [json.loads(line) for line in out.getvalue().splitlines()]
    return {t["uid"]: t for t in trials}


def _wait_for_trials(db_path: str, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if os.path.exists(db_path):
            with Database(db_path) as db:
                if len(db) >= count:
                    return
        time.sleep(0.2)
    pytest.fail(f"fewer than {count} trials after 120 s")


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it, even when this test runs in a
    background job (whose shell made its children ignore SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_mid_run_then_resumed(model_path, tmp_path, sig):
    db_path = str(tmp_path / "t.db")
    process = subprocess.Popen(
        _command(model_path, db_path, "--budget", "10m"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_default_sigint,
    )  # fmt: skip
    _wait_for_trials(db_path, 4, process)
    process.send_signal(sig)
    out, _ = process.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert process.returncode == 130
        assert "every finished trial is in" in out
    before = _uids(db_path)
    assert len(before) >= 4

    again = subprocess.run(
        _command(model_path, db_path, "--trials", "3", "--budget", "2m"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = f"{len(before)} from earlier sessions not measured again"
    assert resumed in " ".join(again.stdout.split()), again.stdout  # rich may wrap lines
    after = _uids(db_path)
    assert set(before) <= set(after) and len(after) == len(before) + 3
    traces = collections.Counter((t["task"], canonical(t["trace"])) for t in after.values())
    assert max(traces.values()) <= 2, "a candidate was measured again (beyond confirming)"


def test_export_and_import(model_path, tmp_path, capsys):
    db_path = str(tmp_path / "t.db")
    assert main(["tune", model_path, "--db", db_path, "--trials", "4", "--no-ort"]) == 0
    out = capsys.readouterr().out
    assert "model latency" in out and "speed-up" in out
    exported = tmp_path / "records.jsonl"
    assert main(["tune", "export", "--db", db_path, "-o", str(exported)]) == 0
    assert len(exported.read_text().splitlines()) == 4
    copy = str(tmp_path / "copy.db")
    assert main(["tune", "import", str(exported), "--db", copy]) == 0
    assert "imported 4 trials" in capsys.readouterr().out
    assert main(["tune", "import", str(exported), "--db", copy]) == 0
    assert "imported 0 trials" in capsys.readouterr().out
    assert set(_uids(copy)) == set(_uids(db_path))


def test_bad_budget_is_refused(model_path, capsys):
    assert main(["tune", model_path, "--budget", "soon"]) == 2
    assert "--budget takes a time" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option",
    [
        ["--shape", "x=a"],
        ["--shape", "x"],
        ["--jobs", "0"],
        ["--trials", "-1"],
        ["--timeout", "-1"],
        ["--timeout", "nan"],
        ["--threads", "-1"],
        ["--seed", "-3"],
    ],
)
def test_bad_options_are_refused_before_tuning(model_path, tmp_path, capsys, option):
    db_path = str(tmp_path / "t.db")
    assert main(["tune", model_path, "--db", db_path, "--no-ort", *option]) == 2
    err = capsys.readouterr().err
    assert f"argument {option[0]}" in err
    assert "Traceback" not in err
    assert not os.path.exists(db_path)  # nothing was tuned
