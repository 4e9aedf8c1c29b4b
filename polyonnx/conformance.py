"""Run the ONNX backend conformance suite's node cases through polyonnx.

    python -m polyonnx.conformance                 # prints "N passed, M failed, K skipped"
    python -m polyonnx.conformance --failures      # ... and one line per failing case
    python -m polyonnx.conformance -k conv         # only cases whose name contains "conv"
    python -m polyonnx.conformance --write-expected tests/conformance/expected_failures.txt

The cases are onnx's own (``onnx.backend.test.BackendTest``, which builds each node case's
model and reference outputs); polyonnx runs them through :mod:`polyonnx.backend` on the CPU.
Skipped cases are the other device's copies of each case.
"""

from __future__ import annotations

import argparse
import re
import sys
import unittest
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

NODE_CLASS = "OnnxBackendNodeModelTest"


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # passed | failed | skipped
    error: str = ""


def node_cases(patterns: Sequence[str] = ()) -> unittest.TestSuite:
    """The CPU node cases as a unittest suite (optionally only names matching a pattern)."""
    import onnx.backend.test

    from polyonnx.backend import PolyonnxBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = onnx.backend.test.BackendTest(PolyonnxBackend, __name__)
    for pattern in patterns:
        runner.include(pattern)
    cls = runner.test_cases[NODE_CLASS]
    names = sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu"))
    if patterns:
        names = [n for n in names if any(re.search(p, n) for p in patterns)]
    return unittest.TestSuite(cls(n) for n in names)


def run_cases(suite: unittest.TestSuite) -> Iterator[Outcome]:
    for case in suite:
        result = unittest.TestResult()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            case.run(result)
        name = case._testMethodName.removesuffix("_cpu")
        if result.skipped:
            yield Outcome(name, "skipped", result.skipped[0][1])
        elif result.errors or result.failures:
            _, text = (result.errors or result.failures)[0]
            yield Outcome(name, "failed", _last_line(text))
        else:
            yield Outcome(name, "passed")


def reason(error: str) -> str:
    """A short, stable reason for an expected-failure list entry."""
    ops = re.findall(r"^\s+(\S+?)(?: \([^)]*\))?: node\(s\)", error, re.M)
    if "UnsupportedOpError" in error and ops:
        return f"op{'s' if len(ops) > 1 else ''} {', '.join(ops)} not lowered"
    rules = [
        (r"has dtype (\w+)", "{} tensors are not supported"),
        (r"unsupported target type (\d+)", "Cast to ONNX type {} is not supported"),
        (
            r"imports no default-domain ONNX opset",
            "not a default-domain model (training or ai.onnx.ml)",
        ),
        (r"uses opset (\d+); polyonnx needs", "opset {} is older than 7"),
        (r"training mode", "training-mode op"),
        (
            r"(\w+) node '[^']*': input \d+ \((\w+)\) must be a constant",
            "{}'s {} is computed at run time (values are specialised only for graph inputs)",
        ),
        (r"has no tensor type of known rank", "sequence or optional input type"),
        (r"(Not equal to tolerance|Mismatched elements)", "numerical mismatch"),
    ]
    for pattern, text in rules:
        match = re.search(pattern, error)
        if match:
            return text.format(*match.groups())
    return error[:120]


def _last_line(text: str) -> str:
    """The final exception of a traceback, with its (possibly multi-line) message."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[\w.]+(Error|Exception)\b", lines[i]):
            return "\n".join(lines[i:])
    return lines[-1].strip() if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyonnx.conformance", description=__doc__)
    parser.add_argument("-k", action="append", default=[], help="only cases matching (regex)")
    parser.add_argument("--failures", action="store_true", help="list failing cases")
    parser.add_argument("--write-expected", metavar="FILE", help="write failing cases + reasons")
    args = parser.parse_args(argv)
    outcomes = []
    for outcome in run_cases(node_cases(args.k)):
        outcomes.append(outcome)
        if args.failures and outcome.status == "failed":
            print(f"FAILED {outcome.name}: {reason(outcome.error)}", flush=True)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("passed", "failed", "skipped")}
    if args.write_expected:
        with open(args.write_expected, "w") as f:
            f.write("# ONNX node conformance cases expected to fail, with the reason.\n")
            f.write("# Regenerate: python -m polyonnx.conformance --write-expected <this file>\n")
            for o in outcomes:
                if o.status == "failed":
                    f.write(f"{o.name}  # {reason(o.error)}\n")
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
