"""The ONNX backend conformance suite's node cases, run through polyonnx.backend.

Every case must pass, or be listed with its reason in expected_failures.txt (regenerate
with ``python -m polyonnx.conformance --write-expected tests/conformance/expected_failures.txt``).
Expected failures are unittest expected failures: one that starts passing fails this
module until it is taken off the list. ``python -m polyonnx.conformance`` prints the
summary line over the whole node suite.
"""

from __future__ import annotations

import pathlib
import warnings

import onnx.backend.test

from polyonnx.backend import PolyonnxBackend

EXPECTED = pathlib.Path(__file__).with_name("expected_failures.txt")


def expected_failures() -> dict[str, str]:
    """{case name: reason} from the checked-in list."""
    entries = {}
    for line in EXPECTED.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, why = line.partition("#")
        entries[name.strip()] = why.strip()
    return entries


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _suite = onnx.backend.test.BackendTest(PolyonnxBackend, __name__)
for _name, _why in expected_failures().items():
    assert _why, f"{_name} is listed in {EXPECTED.name} without a reason"
    _suite.xfail(f"^{_name}_cpu$")

OnnxBackendNodeModelTest = _suite.test_cases["OnnxBackendNodeModelTest"]


def test_every_expected_failure_names_a_real_case():
    cases = {n.removesuffix("_cpu") for n in dir(OnnxBackendNodeModelTest) if n.endswith("_cpu")}
    unknown = sorted(set(expected_failures()) - cases)
    assert not unknown, f"not node cases (stale entries?): {unknown[:10]}"
