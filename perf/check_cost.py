"""The cost of run-time checks (krnl/ir.py's Checked): each case compiled twice, with the
checks' code and without it (emit/codegen.py's ``_KernelWalker.check`` patched to emit the
checked value alone), both timed in alternating rounds; the medians and their ratio.

    python perf/check_cost.py [ROUNDS]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from onnx import helper

import polyonnx
from polyonnx.emit import codegen

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers import make_model, value_info  # noqa: E402

ROUND_SECONDS = 0.05


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Compile without the checks' compare and branch (the checked value only)."""
    saved = codegen._KernelWalker.check
    codegen._KernelWalker.check = lambda self, expr, inst, env, lanes: self.value(
        expr.x, inst, env, lanes
    )
    try:
        yield
    finally:
        codegen._KernelWalker.check = saved


def one_node(op: str, inputs, output, constants=None, **attrs):
    node = helper.make_node(op, [name for name, _, _ in inputs], ["y"], name=op.lower(), **attrs)
    infos = [value_info(n, d, s) for n, d, s in inputs if n not in (constants or {})]
    return make_model([node], infos, [value_info("y", *output)], constants)


def cases():
    """(name, model, feed): the torch models with an embedding Gather or an integer Div,
    and Gather-heavy micro cases."""
    rng = np.random.default_rng(0)
    torch = ROOT / "tests" / "data" / "torch"
    for name in ("gpt_dynamo", "gpt_torchscript"):
        yield name, torch / f"{name}.onnx", {"idx": rng.integers(0, 64, (4, 16))}
    x = rng.standard_normal((2, 10, 32)).astype(np.float32)
    feed = {"x": x, "mask": np.ones((2, 10), bool)}
    yield "encoder_torchscript", torch / "encoder_torchscript.onnx", feed
    table = rng.standard_normal((1000, 256)).astype(np.float32)
    model = one_node(
        "Gather", [("t", np.float32, [1000, 256]), ("i", np.int64, [4096])],
        (np.float32, [4096, 256]), {"t": table},
    )  # fmt: skip
    yield "Gather 1000x256 at 4096", model, {"i": rng.integers(-1000, 1000, 4096)}
    shape = [256, 1024]
    model = one_node(
        "GatherElements", [("d", np.float32, shape), ("i", np.int64, shape)],
        (np.float32, shape), axis=1,
    )  # fmt: skip
    data = rng.standard_normal(shape).astype(np.float32)
    yield "GatherElements 256x1024", model, {"d": data, "i": rng.integers(-1024, 1024, shape)}
    n = 1 << 20
    model = one_node("Div", [("a", np.int32, [n]), ("b", np.int32, [n])], (np.int32, [n]))
    feed = {"a": rng.integers(-1000, 1000, n, np.int32), "b": rng.integers(1, 1000, n, np.int32)}
    yield "Div int32 2^20", model, feed


def seconds(session, feed, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        session.run(None, feed)
    return (time.perf_counter() - start) / repeat


def compare(model, feed, rounds: int) -> tuple[float, float]:
    """Median seconds per run with checks and without, timed in alternating rounds."""
    checked = polyonnx.InferenceSession(model, threads=1, cache=False)
    want = checked.run(None, feed)
    with unchecked():
        plain = polyonnx.InferenceSession(model, threads=1, cache=False)
        got = plain.run(None, feed)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    repeat = max(1, int(ROUND_SECONDS / max(seconds(checked, feed, 3), 1e-7)))
    times: dict[int, list[float]] = {0: [], 1: []}
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for which in order:
            times[which].append(seconds((checked, plain)[which], feed, repeat))
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    print(f"| case | checks (us) | none (us) | ratio |  ({rounds} alternating rounds)")
    print("| --- | --- | --- | --- |")
    for name, model, feed in cases():
        on, off = compare(model, feed, rounds)
        print(f"| {name} | {on * 1e6:.1f} | {off * 1e6:.1f} | {on / off:.3f} |", flush=True)


if __name__ == "__main__":
    main()
