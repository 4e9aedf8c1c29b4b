"""Evolutionary search over one task's space, guided by the cost model.

Each round proposes candidates: mutations (one to three knobs) and crossovers of the
fastest measured genomes, plus fresh random samples; the cost model, refit at the start
of each round on everything measured so far, ranks them; the round measures the
predicted best and one at random (exploration keeps the model honest). The default
genome is never re-measured: the default schedule's own trial stands for it.

    search = TaskSearch(space, seed=0)
    search.record(trace, seconds)            # every finished trial, ok (seconds) or failed (None)
    genomes = search.propose(4)              # not yet measured, best predicted first
"""

from __future__ import annotations

import math
import random

import numpy as np

from polyonnx.tune.cost import CostModel
from polyonnx.tune.db import canonical
from polyonnx.tune.space import Genome, Space, genome_of

ELITES = 5
POOL = 240
EXPLORE = 1
"""Candidates per round chosen at random from the pool rather than by the model."""


class TaskSearch:
    """The search state of one task: what was tried, what ran and how fast, the model."""

    def __init__(self, space: Space, seed: int = 0):
        self.space = space
        self.rng = random.Random(seed)
        self.model = CostModel()
        self.tried: set[str] = set()
        self.results: list[tuple[Genome, float]] = []
        """Measured genomes that ran correctly, with their median seconds."""
        self._stale = True
        self.done = False

    def record(self, trace: list[dict], seconds: float | None, default: bool = False) -> None:
        """A finished trial (seconds None: it failed). The default schedule's trial is
        recorded for the default genome."""
        genome = dict(self.space.default) if default else genome_of(self.space, trace)
        self.tried.add(canonical(trace))
        if genome is None:
            return
        self.tried.add(canonical(self.space.trace(genome)))
        if seconds is not None and math.isfinite(seconds):
            self.results.append((genome, seconds))
            self._stale = True

    def exhausted(self) -> bool:
        """Every point measured, or a round found no new one to propose."""
        return self.done or len(self.tried) >= self.space.size() + 1

    def best(self) -> tuple[Genome, float] | None:
        return min(self.results, key=lambda r: r[1]) if self.results else None

    def propose(self, count: int) -> list[Genome]:
        """Up to ``count`` genomes never proposed before, best predicted first (they count
        as tried from now on)."""
        pool = self._pool()
        if not pool:
            return []
        if self._stale:
            genomes = [g for g, _ in self.results]
            self.model.fit([self.space.features(g) for g in genomes], [s for _, s in self.results])
            self._stale = False
        if self.model.fitted:
            scores = self.model.predict([self.space.features(g) for g in pool])
            ranked = [pool[i] for i in np.argsort(scores, kind="stable")]
        else:
            ranked = pool  # random order (the pool is shuffled)
        explore = min(EXPLORE, max(count - 1, 0)) if self.model.fitted else 0
        chosen = ranked[: count - explore]
        rest = ranked[count - explore :]
        chosen += self.rng.sample(rest, min(explore, len(rest)))
        self.tried.update(canonical(self.space.trace(g)) for g in chosen)  # pending now
        return chosen

    def _pool(self) -> list[Genome]:
        space, rng = self.space, self.rng
        elites = [g for g, _ in sorted(self.results, key=lambda r: r[1])[:ELITES]]
        parents = elites or [dict(space.default)]
        proposals = []
        for _ in range(POOL):
            roll = rng.random()
            if roll < 0.6:
                child = space.mutate(rng.choice(parents), rng, rng.choice((1, 1, 2, 3)))
            elif roll < 0.8 and len(parents) >= 2:
                a, b = rng.sample(parents, 2)
                child = space.mutate(space.crossover(a, b, rng), rng, rng.choice((0, 1)))
            else:
                child = space.sample(rng)
            proposals.append(child)
        seen, pool = set(), []
        for genome in proposals:
            key = canonical(space.trace(genome))
            if key in self.tried or key in seen:
                continue
            seen.add(key)
            pool.append(genome)
        rng.shuffle(pool)
        return pool
