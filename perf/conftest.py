"""Benchmarks: every polyonnx figure has its baseline measured in the same run, so the
number to quote is a ratio. Run: python -m pytest perf --benchmark-only."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
