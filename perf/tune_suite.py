"""Tune the perf/ suite's kernels and the examples on this machine, and write the records
polyonnx ships (tuning/<cpu>.jsonl): per task and key, its default trial and its best one.

    python perf/tune_suite.py --budget 30s --threads 1 2                  # tune, then write
    python perf/tune_suite.py --no-tune --merge /tmp/resnet50.db ...     # only (re)write

Every session's trials go to one database (--db, default .benchmarks/suite-tuning.db), so
a second run resumes. ``--merge`` adds the best records of other databases (e.g. the light
models' 10-minute tunes) to the file.
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib
import sys
import tempfile

import numpy as np
import onnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "perf"))

from polyonnx.target import host_target  # noqa: E402
from polyonnx.tune.cli import parse_budget  # noqa: E402
from polyonnx.tune.db import Database  # noqa: E402
from polyonnx.tune.session import Options, tune  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", default="30s", help="per model and thread count")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--db", default=str(ROOT / ".benchmarks" / "suite-tuning.db"))
    parser.add_argument("--merge", nargs="*", default=[], help="more databases to ship from")
    parser.add_argument("--no-tune", action="store_true", help="only write the records file")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument("-o", "--output", default=None, help="default: tuning/<cpu>.jsonl")
    args = parser.parse_args()
    pathlib.Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    rejected: set[tuple[str, int]] = set()
    if not args.no_tune:
        with tempfile.TemporaryDirectory() as folder:
            for path in _models(pathlib.Path(folder), args.k):
                for threads in args.threads:
                    options = Options(
                        budget_s=parse_budget(args.budget), threads=threads, db=args.db,
                        compare_ort=False, eval_s=0.5,
                    )  # fmt: skip
                    result = tune(str(path), options)
                    latency = result.latency
                    if latency["tuned"] > latency["default"]:  # not shipped: see best_records
                        rejected.update((t.task.hash, threads) for t in result.tasks)
                    print(
                        f"{path.stem:28s} {threads}t  {result.trials:4d} trials  default "
                        f"{latency['default'] * 1e3:8.3f} ms  tuned {latency['tuned'] * 1e3:8.3f}"
                        f" ms  ({latency['default'] / latency['tuned']:.2f}x)",
                        flush=True,
                    )
    output = pathlib.Path(args.output or ROOT / "tuning" / f"{host_target().name}.jsonl")
    lines = []
    for db_path in [args.db, *args.merge]:
        lines += best_records(db_path, rejected)
    unique = {json.loads(line)["uid"]: line for line in lines}
    output.write_text("".join(sorted(unique.values())))
    print(f"wrote {len(unique)} records to {output}")
    return 0


def _models(folder: pathlib.Path, only: str) -> list[pathlib.Path]:
    """The perf suite's kernel models (saved as .onnx files) and the examples."""
    import test_kernels

    paths = []
    for case in test_kernels.CASES:
        if only not in case.name:
            continue
        model, _ = case.build(np.random.default_rng(0))
        path = folder / f"{case.name}.onnx"
        onnx.save(model, path)
        paths.append(path)
    paths += [p for p in sorted((ROOT / "examples").glob("*.onnx")) if only in p.stem]
    return paths


def best_records(db_path: str, rejected: set[tuple[str, int]] = frozenset()) -> list[str]:
    """Per (task, key) of the database: its default trial and its best, as export lines,
    where the best beats the default, except for ``rejected`` (task, threads): the tasks
    of a model that this run measured slower tuned than default as a whole."""
    out = io.StringIO()
    with Database(db_path, create=False) as db:
        db.export_jsonl(out)
        groups: dict[tuple, dict] = {}
        for line in out.getvalue().splitlines():
            trial = json.loads(line)
            key = (trial["task"], json.dumps(trial["key"], sort_keys=True))
            groups.setdefault(key, trial)
        from polyonnx.tune.db import Key

        lines = []
        for trial in groups.values():
            key = Key(**trial["key"])
            if (trial["task"], key.threads) in rejected:
                continue
            best, default = db.best(trial["task"], key), db.default(trial["task"], key)
            if best is not None and default is not None:
                lines += [json.dumps(t.to_json(), sort_keys=True) + "\n" for t in (default, best)]
    return lines


if __name__ == "__main__":
    sys.exit(main())
