"""A symbolic batch compiled once: its latency per batch size against a session
specialised to that size and against onnxruntime, in the same run.

    python perf/symbolic_batch.py                 # every model, 1 and 2 threads
    python perf/symbolic_batch.py --models resnet50 --batches 1 3 8 --threads 1

At one thread the three engines take turns in one process (alternating rounds, medians).
At more threads each engine runs in processes of its own (``--processes``, the engines
taking turns; the median over them): thread pools interfere. Printed: median latency
per engine, the ratios, compiles made by the one session, and what its first call at
each new size cost over its steady latency.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper

import polyonnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
TORCH = ROOT / "tests" / "data" / "torch"
MODELS = ["resnet50", "squeezenet", "shufflenet", "torch_resnet", "torch_encoder"]
BATCHES = [1, 3, 4, 8, 16]
ROUNDS = 7


def symbolic_model(name: str) -> onnx.ModelProto:
    """``name`` with a symbolic batch: the torch exports as they are; the onnx package's
    light CNNs (batch 1) with their batch dim renamed N and their Reshape targets' leading
    1 made -1 (the only batch-1 assumption in them)."""
    if name.startswith("torch_"):
        stem = {"torch_resnet": "resnet_torchscript", "torch_encoder": "encoder_torchscript"}
        return onnx.load(TORCH / f"{stem[name]}.onnx")
    model = onnx.load(LIGHT / f"light_{name}.onnx")
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.input[1] in constants:
            target = numpy_helper.to_array(constants[node.input[1]]).copy()
            if target[0] == 1:
                target[0] = -1
                constants[node.input[1]].CopyFrom(numpy_helper.from_array(target, node.input[1]))
    return model


def pinned(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """``model`` with its symbolic leading dims fixed to ``batch``."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].dim_param:
            dims[0].dim_value = batch
    return model


def feed_for(model: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    weights = {t.name for t in model.graph.initializer}
    feed = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        shape = [d.dim_value or batch for d in value.type.tensor_type.shape.dim]
        kind = value.type.tensor_type.elem_type
        if kind == onnx.TensorProto.BOOL:
            feed[value.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feed[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def ort(model: onnx.ModelProto, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def timed(run, repeat: int) -> float:
    """The median of ``repeat`` calls, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engines(name: str, threads: int, batches, which) -> dict:
    """The engines of ``which`` for ``name``: per batch size a run callable, plus the
    symbolic session's first-call and compile figures."""
    model = symbolic_model(name)
    made: dict = {"runs": {}, "first": {}, "compiles": None}
    feeds = {b: feed_for(model, b) for b in batches}
    if "symbolic" in which:
        session = polyonnx.InferenceSession(model, threads=threads, cache=False)
        for b in batches:
            start = time.perf_counter()
            session.run(None, feeds[b])
            made["first"][b] = time.perf_counter() - start
            made["runs"][("symbolic", b)] = lambda s=session, f=feeds[b]: s.run(None, f)
        made["compiles"] = session.compile_count
    for b in batches:
        if "specialised" in which:
            fixed = polyonnx.InferenceSession(pinned(model, b), threads=threads, cache=False)
            made["runs"][("specialised", b)] = lambda s=fixed, f=feeds[b]: s.run(None, f)
        if "onnxruntime" in which:
            baseline = ort(model, threads)
            made["runs"][("onnxruntime", b)] = lambda s=baseline, f=feeds[b]: s.run(None, f)
    return made


def measure(name: str, threads: int, batches, which) -> dict:
    """Median latency per (engine, batch), alternating the engines round by round."""
    made = engines(name, threads, batches, which)
    for run in made["runs"].values():
        run()  # warm
    rounds: dict = {key: [] for key in made["runs"]}
    for _ in range(ROUNDS):
        for key, run in made["runs"].items():
            repeat = max(1, min(20, int(0.05 / max(timed(run, 1), 1e-6))))
            rounds[key].append(timed(run, repeat))
    first = {
        b: made["first"][b] - statistics.median(rounds[("symbolic", b)]) for b in made["first"]
    }
    return {
        "latency": {f"{e}/{b}": statistics.median(v) for (e, b), v in rounds.items()},
        "first_over_steady": {str(b): v for b, v in first.items()},
        "compiles": made["compiles"],
    }


def in_process(name: str, threads: int, batches, engine: str) -> dict:
    """``measure`` of one engine, in a process of its own."""
    command = [sys.executable, __file__, "--worker", engine, "--models", name]
    command += ["--threads", str(threads), "--batches", *map(str, batches)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ)
    return json.loads(out.stdout.strip().splitlines()[-1])


def in_processes(name: str, threads: int, batches, processes: int) -> dict:
    """Every engine in ``processes`` processes of its own, the engines taking turns; per
    (engine, batch) the median over the processes (one process's median at 2 threads
    varied by up to 2x from the next one's: docs/measurements.md, 'Two threads, process
    to process')."""
    parts = [
        in_process(name, threads, batches, engine)
        for _ in range(processes)
        for engine in ("symbolic", "specialised", "onnxruntime")
    ]
    keys = {k for p in parts for k in p["latency"]}
    latency = {
        k: statistics.median(p["latency"][k] for p in parts if k in p["latency"]) for k in keys
    }
    symbolic = parts[0]
    return {
        "latency": latency,
        "first_over_steady": symbolic["first_over_steady"],
        "compiles": symbolic["compiles"],
    }


def table(name: str, threads: int, batches, found: dict) -> None:
    latency = found["latency"]
    print(f"\n{name}, {threads} thread(s): one session, {found['compiles']} compile(s)")
    columns = ["batch", "symbolic ms", "specialised ms", "onnxruntime ms", "sym/spec"]
    print(" | ".join([*columns, "sym/ort", "first - steady s"]))
    for b in batches:
        sym, spec, base = (latency[f"{e}/{b}"] for e in ("symbolic", "specialised", "onnxruntime"))
        first = found["first_over_steady"].get(str(b), float("nan"))
        print(
            f"{b:5d} | {sym * 1e3:11.2f} | {spec * 1e3:14.2f} | {base * 1e3:14.2f} | "
            f"{sym / spec:8.2f} | {sym / base:7.2f} | {first:14.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--batches", nargs="+", type=int, default=BATCHES)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.models[0], args.threads[0], args.batches, {args.worker})))
        return
    for name in args.models:
        for threads in args.threads:
            if threads == 1:
                found = measure(name, 1, args.batches, {"symbolic", "specialised", "onnxruntime"})
            else:
                found = in_processes(name, threads, args.batches, args.processes)
            table(name, threads, args.batches, found)


if __name__ == "__main__":
    main()
