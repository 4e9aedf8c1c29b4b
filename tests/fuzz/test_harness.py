"""The fuzz harness itself: the generator is deterministic and covers every template, and
the oracle classifies a crash, a hang, a memory blow-up, a stray exception, a wrong
result and a silent acceptance as failures (the self-test cases of negative seeds)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from . import cases
from .child import PASSING
from .harness import Zygote
from .models import damage, varint, varints

EXPECTED = {
    "crash": "crash",
    "memory": "memory",
    "hang": "hang",
    "exception": "exception",
    "exit": "crash",
    "wrong": "wrong",
    "silent": "silent",
    "refused": "refused",
    "ok": "ok",
}


@pytest.fixture(scope="module")
def zygote():
    z = Zygote(timeout=8)
    yield z
    z.close()


@pytest.mark.parametrize(
    "index", range(len(cases.SELF_TESTS)), ids=lambda i: cases.SELF_TESTS[i].name
)
def test_oracle_classifies(zygote, index):
    name = cases.SELF_TESTS[index].name
    verdict = zygote.run(-index - 1)
    assert verdict["outcome"] == EXPECTED[name], verdict
    assert (verdict["outcome"] in PASSING) == (name in ("refused", "ok"))


def test_ci_corpus_covers_every_template_and_its_first_variants():
    seen = {}
    for seed in range(cases.ci_cases()):
        t, variant = cases._pick(seed)
        seen.setdefault(t.name, set()).add(variant)
    for t in cases.TEMPLATES:
        assert seen[t.name] == set(range(min(cases.variants(t), cases.CI_VARIANTS))), t.name
    assert {cases.pick(seed).family for seed in range(cases.ci_cases())} == set(cases.FAMILIES)


def test_the_reference_gets_the_values_polyonnx_gets():
    import numpy as np

    for seed in range(cases.ci_cases()):
        scn = cases.scenario(seed)
        if not isinstance(scn.feeds, dict) or scn.ort_feeds is None:
            continue
        for name in scn.feeds.keys() & scn.ort_feeds.keys():
            given, reference = scn.feeds[name], scn.ort_feeds[name]
            nan = np.asarray(given).dtype.kind == "f"
            assert np.array_equal(given, reference, equal_nan=nan), (seed, name)


def test_later_seeds_draw_every_family():
    start = len(cases.enumerated())
    assert {cases.pick(seed).family for seed in range(start, start + 200)} == set(cases.FAMILIES)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**9))
def test_a_seed_always_makes_the_same_case(seed):
    first, again = cases.scenario(seed), cases.scenario(seed)
    assert first.model == again.model
    assert first.note == again.note
    assert cases.label(seed) == cases.label(seed)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**64 - 1))
def test_varint_round_trips(value):
    data = bytes([0x08]) + varint(value)  # field 1, wire type 0
    assert varints(data) == [(0, 1), (1, len(data) - 1)]


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["truncate", "bitflip", "insert", "delete", "varint"]), st.integers(0, 2**32)
)
def test_damage_changes_the_bytes(kind, seed):
    import random

    data = cases.mm_bias_relu().SerializeToString()
    bad, note = damage(data, kind, random.Random(seed))
    assert note
    if kind in ("truncate", "insert", "delete"):
        assert bad != data


def test_the_doc_states_the_corpus():
    from .models import ROOT

    text = (ROOT / "docs" / "fuzzing.md").read_text()
    ci, every = cases.ci_cases(), len(cases.enumerated())
    assert f"seeds 0 to {ci - 1}," in text
    assert f"{len(cases.TEMPLATES)} templates" in text
    assert f"--cases {every}`" in text
    groups = ("malformed_trace_", "bad_args_", "invalid_", "oob_")  # named as a group
    for t in cases.TEMPLATES:
        group = next((g for g in groups if t.name.startswith(g)), None)
        assert f"`{group or t.name}" in text, t.name
