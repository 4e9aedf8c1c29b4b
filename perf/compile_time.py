"""Cold and warm compile times: each model's InferenceSession built in a fresh process,
first with an empty compile cache (cold), then loading what that run stored (warm).

    python perf/compile_time.py [MODEL ...] [--rounds 3] [--pythonpath DIR]

Models are paths, or names of onnx's light models (light_resnet50.onnx). The time is from
the constructor's call until the session holds native code for zero inputs (one thread);
the import of polyonnx is not in it. ``--pythonpath`` times another checkout (before and
after a change: run it on both, alternating, and compare medians). docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

DEFAULT = [
    "light_resnet50.onnx",
    "light_densenet121.onnx",
    "light_inception_v1.onnx",
    "tests/data/torch/encoder_torchscript.onnx",
]
CHILD = """
import json, os, sys, time
import numpy as np, onnx
import polyonnx
path = sys.argv[1]
if not os.path.exists(path):
    path = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light", path)
start = time.perf_counter()
session = polyonnx.InferenceSession(path, threads=1)
feed = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
        for i in session.get_inputs()}
compiled = session.compiled_for(feed)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "cached": bool(getattr(compiled, "cached", False))}))
"""


def timed(model: str, cache: str, pythonpath: str | None) -> dict:
    env = {**os.environ, "POLYONNX_CACHE_DIR": cache, "POLYONNX_CACHE": "on"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    model = os.path.abspath(model) if os.path.exists(model) else model
    done = subprocess.run(  # in the cache's folder: not this checkout's polyonnx by chance
        [sys.executable, "-c", CHILD, model],
        env=env, cwd=cache, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pythonpath")
    args = parser.parse_args()
    print(f"{'model':40} {'cold s':>8} {'warm s':>8}")
    for model in args.models:
        cold, warm = [], []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as cache:
                cold.append(timed(model, cache, args.pythonpath)["seconds"])
                again = timed(model, cache, args.pythonpath)
                warm.append(again["seconds"] if again["cached"] else float("nan"))
        name = os.path.basename(model)
        print(f"{name:40} {statistics.median(cold):8.2f} {statistics.median(warm):8.2f}")


if __name__ == "__main__":
    main()
