"""At more than one thread a batch's samples run side by side, groups of them at once on
the worker pool, each group on its own arena (runtime/side_by_side.py): every size of a
sequence matches onnxruntime, a failed check in any sample is raised, and a poisoned
arena changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import RunError
from polyonnx.runtime.side_by_side import pool_available
from tests.helpers import fast
from tests.runtime.test_blocks import CASES, SIZES, TORCH_CASES, Harness

pytestmark = pytest.mark.skipif(not pool_available(), reason="no worker pool in this process")
NAMES = ("cnn", "embedding", "attention", "reductions", "resnet")
_HARNESSES: dict[str, Harness] = {}


def harness(name: str) -> Harness:
    if name not in _HARNESSES:
        _HARNESSES[name] = Harness({**CASES, **TORCH_CASES}[name](), threads=2)
    return _HARNESSES[name]


def side_by_side_ran(run: Harness, feed) -> bool:
    """Whether the session's one-sample code has run samples in groups of two."""
    return 2 in run.session.runner_for(feed).model._groups


@pytest.mark.parametrize("name", NAMES)
@fast(max_examples=8)
@given(sizes=SIZES, seed=st.integers(0, 2**16))
def test_sizes_match_side_by_side(name, sizes, seed):
    """Sizes odd and even, 1 and primes: the pairs and the last odd sample all agree."""
    run = harness(name)
    for n in sizes:
        feed = run.check(n, seed)
    run.check_blocked(feed)
    if max(sizes) >= 2:
        assert side_by_side_ran(run, feed)


@fast(max_examples=15)
@given(n=st.integers(2, 9), bad=st.data())
def test_a_failed_check_in_any_sample_is_raised(n, bad):
    """An index out of range in one sample, in a pair or the last odd one, raises RunError
    naming the Gather; the next good run is right."""
    run = harness("embedding")
    feed = run.case.feed(n, 0)
    sample = bad.draw(st.integers(0, n - 1))
    broken = {**feed, "ids": feed["ids"].copy()}
    broken["ids"][sample, bad.draw(st.integers(0, 6))] = 11
    with pytest.raises(RunError, match="Gather"):
        run.session.run(None, broken)
    run.check(n, 1)


def test_poisoned_arenas_change_nothing(monkeypatch):
    """Every group's arena starts as 0xff bytes (NaN): results match all the same."""
    monkeypatch.setenv("POLYONNX_POISON_ARENA", "1")
    run = Harness(CASES["attention"](), threads=2)
    for n in (4, 7, 2):
        feed = run.check(n, n)
    assert side_by_side_ran(run, feed)
