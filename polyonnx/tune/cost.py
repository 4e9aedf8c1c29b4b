"""The cost model: predicted log-time of a candidate from the features of its genome.

Ridge regression (numpy least squares) on the features of tune/space.py plus their
squares, refit whenever a task has new measurements. It is cheap enough to rank a few
hundred proposals per round, and good enough that most measured candidates are good ones:
the search measures the predicted best, plus a few at random to keep learning.

    model = CostModel()
    model.fit(feature_rows, seconds)         # at least MIN_POINTS measurements
    model.predict(feature_rows)              # log seconds; lower is better
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_POINTS = 6
RIDGE = 1e-2


class CostModel:
    def __init__(self) -> None:
        self.weights: np.ndarray | None = None
        self.mean: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    @property
    def fitted(self) -> bool:
        return self.weights is not None

    def fit(self, features: Sequence[Sequence[float]], seconds: Sequence[float]) -> bool:
        """Fit on measured candidates; False (and unfitted) with too few of them."""
        if len(seconds) < MIN_POINTS:
            self.weights = None
            return False
        x = _expand(np.asarray(features, dtype=np.float64))
        self.mean = x.mean(axis=0)
        self.scale = x.std(axis=0) + 1e-9
        x = np.hstack([(x - self.mean) / self.scale, np.ones((len(x), 1))])
        y = np.log(np.asarray(seconds, dtype=np.float64))
        penalty = RIDGE * len(y) * np.eye(x.shape[1])
        penalty[-1, -1] = 0.0  # the intercept is not shrunk
        self.weights = np.linalg.solve(x.T @ x + penalty, x.T @ y)
        return True

    def predict(self, features: Sequence[Sequence[float]]) -> np.ndarray:
        if self.weights is None:
            raise ValueError("the cost model has not been fitted")
        x = _expand(np.asarray(features, dtype=np.float64))
        x = np.hstack([(x - self.mean) / self.scale, np.ones((len(x), 1))])
        return x @ self.weights


def _expand(x: np.ndarray) -> np.ndarray:
    """The features and their squares (times grow non-linearly with block sizes)."""
    return np.hstack([x, x * x])
