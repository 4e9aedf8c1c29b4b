"""Test-wide settings: under CI (CI=true) hypothesis is derandomised, so a CI run is
reproducible; locally every run explores new examples. Intermediates start poisoned, so
a read before a write shows."""

from __future__ import annotations

import os

from hypothesis import settings

os.environ.setdefault("POLYONNX_POISON_ARENA", "1")  # see polyonnx/runtime/compiled.py
os.environ.setdefault("POLYONNX_CACHE", "off")  # tests that use the compile cache say so

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
