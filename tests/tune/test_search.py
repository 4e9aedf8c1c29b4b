"""The cost model learns; the search proposes only new candidates."""

from __future__ import annotations

import numpy as np

from polyonnx.runtime.compiled import lower_model
from polyonnx.tune.cost import CostModel
from polyonnx.tune.db import canonical
from polyonnx.tune.search import TaskSearch
from polyonnx.tune.space import space_for


def test_cost_model_ranks_a_known_function():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 4, size=(60, 3))
    seconds = np.exp(0.5 * x[:, 0] - 0.3 * x[:, 1] + 0.1 * x[:, 2] ** 2)
    model = CostModel()
    assert model.fit(x[:40], seconds[:40])
    predicted = model.predict(x[40:])
    order = np.argsort(np.argsort(predicted)) - np.argsort(np.argsort(seconds[40:]))
    rank_corr = 1 - 6 * np.sum(order**2) / (20 * (20**2 - 1))
    assert rank_corr > 0.9


def test_cost_model_needs_a_few_points():
    model = CostModel()
    assert not model.fit([[1.0]], [1.0])
    assert not model.fitted


def test_search_never_proposes_what_was_measured(model_path):
    program = lower_model(model_path)
    space = space_for(program.kernel("mm1"), program.buffers, threads=2, lanes=16)
    search = TaskSearch(space, seed=0)
    search.record([], 1e-3 * (1 + space.default["mr"]), default=True)
    seen = {canonical(space.trace(space.default))}
    for round_ in range(6):
        proposals = search.propose(4)
        assert proposals
        for genome in proposals:
            key = canonical(space.trace(genome))
            assert key not in seen
            seen.add(key)
            # a made-up time that prefers small mr: the model must steer towards it
            search.record(space.trace(genome), 1e-3 * (1 + genome["mr"]) * (1 + 0.01 * round_))
    assert search.model.fitted
    best, _ = search.best()
    assert best["mr"] <= 4
