"""Test-wide settings: under CI (CI=true) hypothesis is derandomised, so a CI run is
reproducible; locally every run explores new examples."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
