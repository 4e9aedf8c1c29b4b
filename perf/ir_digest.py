"""SHA-256 of the LLVM IR polyonnx generates for a set of models: run it before and after
a change that must not change code (a refactoring) and compare the lines.

    python perf/ir_digest.py [MODEL ...] > digests.txt

Default models: examples/mlp.onnx, the torch exports in tests/data/torch (batch 2) and
onnx's nine light CNNs. The IR is the whole model in one module (emit_module), with the
host's default schedules, before LLVM optimises it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys

import onnx

from polyonnx.emit.module import emit_module
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.krnl.verify import check_bounds
from polyonnx.runtime.compiled import default_schedules, optimize
from polyonnx.runtime.memory import plan_memory
from polyonnx.schedule.heuristics.panels import pack_constants
from polyonnx.target import host_target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def models() -> list[str]:
    light = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light")
    torch = sorted(glob.glob(os.path.join(ROOT, "tests/data/torch/*.onnx")))
    return [os.path.join(ROOT, "examples/mlp.onnx"), *torch, *sorted(glob.glob(f"{light}/*.onnx"))]


def digest(path: str) -> str:
    graph = load_graph(path, supported_ops=supported_ops())
    if not graph.is_static:
        shapes = {v.name: [2 if isinstance(d, str) else d for d in v.shape] for v in graph.inputs}
        graph = load_graph(path, supported_ops=supported_ops(), input_shapes=shapes)
    program = optimize(lower(graph))
    program, schedules = pack_constants(program, default_schedules(program))
    check_bounds(program)
    layout = plan_memory(program)
    places = {name: (p.slot, p.offset) for name, p in layout.places.items()}
    module, _ = emit_module(schedules, program.buffers, places, host_target())
    return hashlib.sha256(str(module).encode()).hexdigest()


def main() -> None:
    for path in sys.argv[1:] or models():
        try:
            print(f"{os.path.basename(path):40} {digest(path)}", flush=True)
        except Exception as exc:  # a model that does not compile: say so, go on
            print(f"{os.path.basename(path):40} error {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
