"""The autotuner behind ``polyonnx tune`` (docs/tuning.md): tasks.py (distinct kernels),
space.py (trace knobs), search.py and cost.py (evolutionary search, cost model),
measure.py, worker.py and runner.py (safe measurement), db.py (SQLite records),
session.py (a session), apply.py (records in use), evaluate.py, cli.py."""
