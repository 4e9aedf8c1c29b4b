"""The README's first two lines are what a newcomer types: they must stay true."""

from __future__ import annotations

import pathlib
import shlex

from polyonnx.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _first_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return block.strip().splitlines()


def test_readme_begins_with_the_install_and_tune_line_and_the_test_line():
    install_tune, install_test = _first_lines()
    assert install_tune.startswith("pip install . && polyonnx tune examples/")
    assert install_test == 'pip install ".[test]" && python -m pytest -q -n auto'


def test_the_tune_line_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    command = shlex.split(_first_lines()[0].split("&&", 1)[1])
    assert command[0] == "polyonnx"
    # the same command, into a scratch database and cut to a few trials
    args = [*command[1:], "--db", str(tmp_path / "t.db"), "--trials", "3", "--no-ort"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "3 trials this session" in out and "model latency" in out
