"""The fuzz corpus: every seed's case runs in a forked child with a memory cap and a
timeout, and must end in a correct result or a PolyonnxError (docs/fuzzing.md).

POLYONNX_FUZZ_SECONDS=3600 adds a campaign of new seeds for that long, after the corpus."""

from __future__ import annotations

import os
import time

import pytest

from .cases import label
from .harness import Zygote, corpus, describe, passed

SECONDS = float(os.environ.get("POLYONNX_FUZZ_SECONDS", 0))


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


@pytest.mark.parametrize("seed", corpus(), ids=label)
def test_case(zygote, seed):
    verdict = zygote.run(seed)
    assert passed(verdict), describe(verdict)


@pytest.mark.skipif(not SECONDS, reason="set POLYONNX_FUZZ_SECONDS to run a campaign")
def test_campaign(zygote):
    """New seeds (from POLYONNX_FUZZ_START, default 10**6) until the time is up; every
    failure is listed, with its reproduction line."""
    seed = int(os.environ.get("POLYONNX_FUZZ_START", 10**6))
    deadline = time.monotonic() + SECONDS
    failures = []
    while time.monotonic() < deadline:
        verdict = zygote.run(seed)
        if not passed(verdict):
            failures.append(describe(verdict))
        seed += 1
    assert not failures, "\n\n".join(failures)
