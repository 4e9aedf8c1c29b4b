"""``polyonnx bench`` and ``polyonnx dashboard``: arguments, the compare gate's exit code,
the site's files, and one real (tiny) saved run of the perf/ suite."""

from __future__ import annotations

import argparse
import json
import re
import subprocess

import pytest

from polyonnx.bench.cli import add_commands
from polyonnx.bench.history import load_history
from polyonnx.cli import main
from tests.bench.synthetic import BENCHES, IMPROVEMENT, REGRESSION, known_history

FIRST_REGRESSED = REGRESSION[2] + 1  # run numbers count from 1
FIRST_IMPROVED = IMPROVEMENT[2] + 1


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="polyonnx")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_bench_arguments():
    args = parse("bench")
    assert (args.suite, args.save, str(args.history), args.compare) == (
        "quick", False, ".benchmarks", None,
    )  # fmt: skip
    assert args.fail_above == 0.05 and args.alpha == 0.01
    args = parse("bench", "--suite", "full", "--save", "--compare", "last", "--fail-above",
                 "10%", "-k", "matmul", "--", "--benchmark-max-time=0.1")  # fmt: skip
    assert (args.suite, args.save, args.compare, args.select) == ("full", True, "last", "matmul")
    assert args.fail_above == pytest.approx(0.10)
    assert args.pytest_args[-1] == "--benchmark-max-time=0.1"
    assert parse("bench", "--fail-above", "7").fail_above == pytest.approx(0.07)
    assert callable(args.handler)


@pytest.mark.parametrize("argv", [["bench", "--suite", "huge"], ["bench", "--fail-above", "x"],
                                  ["bench", "--fail-above", "-5%"]])  # fmt: skip
def test_bad_bench_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_dashboard_arguments():
    args = parse("dashboard", "--history", "h", "-o", "site", "--threshold", "3%")
    assert (str(args.history), str(args.output), args.threshold) == ("h", "site", 0.03)
    defaults = parse("dashboard")
    assert defaults.output is None  # HISTORY/dashboard
    assert (defaults.threshold, defaults.z, defaults.window) == (0.075, 3.0, 5)
    args = parse("dashboard", "--z", "2.5", "--window", "2")
    assert (args.z, args.window) == (2.5, 2)


@pytest.mark.parametrize("argv", [["--z", "0"], ["--z", "x"], ["--window", "1"],
                                  ["--window", "2.5"], ["--threshold", "0"]])  # fmt: skip
def test_bad_dashboard_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("dashboard", *argv)
    assert exit_info.value.code == 2
    assert "expected" in capsys.readouterr().err


def test_dashboard_window_and_z_reach_the_verdicts(tmp_path, capsys):
    """--z 1000 leaves no change confident enough to flag; --window 2 sets levels from 2
    runs (the page says so)."""
    known_history(tmp_path / "h")
    site = tmp_path / "s"
    assert main(["dashboard", "--history", str(tmp_path / "h"), "-o", str(site)]) == 0
    assert "▲ +20." in (site / "index.html").read_text()
    argv = ["dashboard", "--history", str(tmp_path / "h"), "-o", str(site), "--z", "1000"]
    assert main(argv) == 0
    assert "None: no run changed a benchmark" in (site / "index.html").read_text()
    assert main([*argv[:-2], "--window", "2"]) == 0
    assert "first 2 runs" in (site / "index.html").read_text()


def test_compare_gate_fails_on_the_regression(tmp_path, capsys):
    known_history(tmp_path)
    argv = ["bench", "--history", str(tmp_path), "--current", str(FIRST_REGRESSED)]
    assert main([*argv, "--compare", str(FIRST_REGRESSED - 1)]) == 1
    out = capsys.readouterr().out
    assert "regressions: 1" in out
    offender = next(line for line in out.splitlines() if line.startswith("  matmul-256 1t"))
    assert re.search(r"\+20\.\d%, p = ", offender) and "onnxruntime" in offender
    # the same change under a 25% threshold passes
    assert main([*argv, "--compare", str(FIRST_REGRESSED - 1), "--fail-above", "25%"]) == 0


def test_compare_gate_passes_noise_and_improvements(tmp_path, capsys):
    known_history(tmp_path)
    base = ["bench", "--history", str(tmp_path)]
    assert main([*base, "--current", "3", "--compare", "2"]) == 0
    assert "regressions: none" in capsys.readouterr().out
    assert main([*base, "--current", str(FIRST_IMPROVED), "--compare", "last"]) == 0
    out = capsys.readouterr().out
    assert "improvements: 1" in out and "conv-3x3-64to64-56 2t" in out
    assert f"compared with run #{FIRST_IMPROVED - 1} " in out  # last: the newest but itself


def test_compare_with_an_unknown_run_is_an_error(tmp_path, capsys):
    known_history(tmp_path)
    assert main(["bench", "--history", str(tmp_path), "--current", "2", "--compare", "77"]) == 2
    assert "no run of bench-box" in capsys.readouterr().err
    assert main(["bench", "--history", str(tmp_path), "--current", "2"]) == 2
    assert "--current RUN goes with --compare" in capsys.readouterr().err


def test_dashboard_writes_a_site_listing_every_benchmark(tmp_path, capsys):
    known_history(tmp_path / "h", other_machine=True)
    assert main(["dashboard", "--history", str(tmp_path / "h"), "-o", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "16 runs of 2 machines: wrote 2 pages" in out
    assert f"open {(tmp_path / 's' / 'index.html').as_uri()}" in out
    pages = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert pages == ["index.html", "machine-bench-box-test-cpu-9000-2.html"]
    html = (tmp_path / "s" / "machine-bench-box-test-cpu-9000-2.html").read_text()
    overview = html[html.index('<table id="overview">') :]
    overview = overview[: overview.index("</table>")]
    listed = re.findall(r'<a href="#b-[^"]+">([^<]+)</a>.*?</td><td>(\d+)</td>', overview)
    assert sorted(listed) == sorted((b.case, str(b.threads)) for b in BENCHES)
    assert "▲ +20." in html and "▼ -2" in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing fetched: works offline


def test_dashboard_default_output_and_empty_history(tmp_path, capsys):
    assert main(["dashboard", "--history", str(tmp_path)]) == 0
    assert "no saved runs yet" in capsys.readouterr().out
    assert "No saved runs yet" in (tmp_path / "dashboard" / "index.html").read_text()
    assert main(["dashboard", "--history", str(tmp_path / "missing")]) == 2
    assert "save runs first" in capsys.readouterr().err


def test_bench_saves_a_real_run_of_the_quick_suite(tmp_path, capsys):
    """One numpy MatMul of perf/, timed briefly: the saved file is pytest-benchmark's, with
    per-round data, the commit, and polyonnx's machine info."""
    history = tmp_path / "history"
    argv = ["bench", "--save", "--history", str(history), "-k", "test_numpy and matmul-256-1t",
            "--", "--benchmark-max-time=0.02"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--benchmark-save-data" in out
    assert re.search(r"quick suite: 1 benchmarks in \d+ s wall", out)
    runs, skipped = load_history(history)
    assert len(runs) == 1 and not skipped
    run = runs[0]
    assert f"saved: {run.path}" in out
    assert run.path.parent.parent == history and run.number == 1
    data = json.loads(run.path.read_text())
    (record,) = data["benchmarks"]
    assert record["extra_info"]["impl"] == "numpy"
    assert len(record["stats"]["data"]) == record["stats"]["rounds"] >= 5
    assert data["suite"] == "quick"
    ours = data["machine_info"]["polyonnx"]
    assert ours["llvm_version"].count(".") == 2 and ours["peak_gflops_per_core"] > 0
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert run.commit == head.stdout.strip()
    assert run.machine.cpu == data["machine_info"]["cpu"]["brand_raw"]
