"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (polyonnx/krnl/ops/loss.py)
against a numpy reference: every reduction, with and without class weights and
ignore_index (inside, outside and below the class range), inputs of rank 2 to 5."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import lower
from tests.helpers import DIMS, check_node, const, fast, node_model, random_array, seeds

LOSS_TOL = {"rtol": 2e-5, "atol": 2e-5}
"""Sums of up to a few thousand terms, plus exp/log for the log-softmax."""


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _nll(
    scores: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None,
    reduction: str,
    ignore_index: int | None,
    dtype,
) -> np.ndarray:
    """The loss in float64, then rounded to ``dtype`` (the ONNX reference, vectorised)."""
    scores = scores.astype(np.float64)
    ignored = np.zeros(target.shape, bool) if ignore_index is None else target == ignore_index
    cls = np.where(ignored, 0, target).astype(np.int64)
    picked = np.take_along_axis(scores, cls[:, None], axis=1)[:, 0]
    w = np.ones(target.shape) if weight is None else weight.astype(np.float64)[cls]
    w = np.where(ignored, 0.0, w)
    loss = np.where(ignored, 0.0, -picked * w)
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        with np.errstate(invalid="ignore"):
            loss = loss.sum() / w.sum()
    return np.asarray(loss).astype(dtype)


@st.composite
def problems(draw, max_size: int = 3000):
    """Scores [N, C, d..] (rank 2..5), a target with some ignore_index entries, a weight."""
    rank = draw(st.integers(2, 5))
    shape = [draw(st.sampled_from(DIMS)) for _ in range(rank)]
    while int(np.prod(shape)) > max_size:
        shape[int(np.argmax(shape))] = 1
    classes = shape[1]
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape, np.float32, -5, 5)
    tshape = (shape[0], *shape[2:])
    target = rng.integers(0, classes, size=tshape)
    ignore = draw(
        st.none() | st.sampled_from([0, classes - 1, classes, classes + 7, -1, -100]),
        label="ignore_index",
    )
    if ignore is not None:
        target = np.where(rng.random(tshape) < 0.3, ignore, target)
    target = target.astype(draw(st.sampled_from([np.int64, np.int32]), label="target dtype"))
    weight = draw(st.booleans(), label="weighted")
    w = random_array(rng, (classes,), np.float32, 0.1, 2.0) if weight else None
    reduction = draw(st.sampled_from(["none", "sum", "mean"]), label="reduction")
    return x, target, w, reduction, ignore


def _attrs(reduction: str, ignore: int | None) -> dict:
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    return attrs


@fast(25)
@given(problem=problems())
def test_nll_loss(problem):
    x, target, w, reduction, ignore = problem
    if reduction == "mean" and ignore is not None and (target == ignore).all():
        target = target.copy()  # (an all-ignored mean is 0/0; tested separately)
        target.flat[0] = 0
    expected = _nll(x, target, w, reduction, ignore, np.float32)
    args = [x, target] if w is None else [x, target, w]
    check_node(
        "NegativeLogLikelihoodLoss", args, expected, tol=LOSS_TOL, **_attrs(reduction, ignore)
    )


@fast(25)
@given(problem=problems(), log_prob=st.booleans())
def test_softmax_cross_entropy_loss(problem, log_prob):
    x, target, w, reduction, ignore = problem
    if reduction == "mean" and ignore is not None and (target == ignore).all():
        target = target.copy()
        target.flat[0] = 0
    lp = _log_softmax(x)
    expected = [_nll(lp, target, w, reduction, ignore, np.float32)]
    if log_prob:
        expected.append(lp.astype(np.float32))
    args = [x, target] if w is None else [x, target, w]
    check_node(
        "SoftmaxCrossEntropyLoss",
        args,
        expected,
        tol=LOSS_TOL,
        opset=13,
        **_attrs(reduction, ignore),
    )


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_float16_accumulates_in_float32(op, reduction):
    """3000 float16 terms: summed in float32 and rounded once."""
    rng = np.random.default_rng(3)
    x = random_array(rng, (4, 5, 750), np.float16, -3, 3)
    target = rng.integers(0, 5, size=(4, 750))
    scores = _log_softmax(x) if op == "SoftmaxCrossEntropyLoss" else x
    expected = _nll(scores, target, None, reduction, None, np.float16)
    check_node(op, [x, target], expected, tol={"rtol": 1e-3, "atol": 1e-3}, reduction=reduction)


def test_default_reduction_is_mean():
    rng = np.random.default_rng(0)
    x, target = random_array(rng, (7, 3), np.float32), rng.integers(0, 3, size=(7,))
    check_node("NegativeLogLikelihoodLoss", [x, target], _nll(x, target, None, "mean", None, "f4"))


def test_ignored_targets_contribute_zero_even_with_inf_scores():
    """An ignored position reads some clamped class; its score must not leak in."""
    x = np.array([[np.inf, 1, 2], [0.5, np.nan, -np.inf]], np.float32)
    target = np.array([-1, -1])
    weight = np.array([1, 2, 3], np.float32)
    for reduction, expected in [("none", [0, 0]), ("sum", 0)]:
        check_node(
            "NegativeLogLikelihoodLoss",
            [x, target, weight],
            np.asarray(expected, np.float32),
            reduction=reduction,
            ignore_index=-1,
        )


def test_mean_of_only_ignored_targets_is_nan():
    """0 / 0, as onnxruntime gives."""
    x = np.zeros((2, 3), np.float32)
    check_node(
        "NegativeLogLikelihoodLoss",
        [x, np.array([1, 1])],
        np.float32(np.nan),
        reduction="mean",
        ignore_index=1,
    )


def test_weighted_mean_divides_by_the_weights_of_kept_targets():
    x = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]], np.float32))
    target = np.array([0, 2, 1])
    weight = np.array([2.0, 1.0, 4.0], np.float32)
    # kept: rows 0 and 2 (row 1 targets the ignored class 2): (2*-log .5 + 1*-log .3) / 3
    expected = np.float32((-2 * np.log(0.5) - np.log(0.3)) / 3)
    check_node(
        "NegativeLogLikelihoodLoss",
        [x, target, weight],
        expected,
        reduction="mean",
        ignore_index=2,
    )


def test_large_logits_do_not_overflow():
    x = np.array([[1000, 1001, 1002], [-1000, -1000, -1000], [1e38, 0, -1e38]], np.float32)
    target = np.array([2, 0, 1])
    lp = _log_softmax(x)
    expected = [_nll(lp, target, None, "none", None, np.float32), lp.astype(np.float32)]
    check_node(
        "SoftmaxCrossEntropyLoss", [x, target], expected, tol={"rtol": 1e-5, "atol": 1e-3},
        reduction="none",
    )  # fmt: skip


def test_float64():
    rng = np.random.default_rng(5)
    x = random_array(rng, (3, 4, 5), np.float64)
    target = rng.integers(0, 4, size=(3, 5))
    w = random_array(rng, (4,), np.float64, 0.5, 1.5)
    expected = _nll(_log_softmax(x), target, w, "mean", None, np.float64)
    check_node("SoftmaxCrossEntropyLoss", [x, target, w], expected, tol={"rtol": 1e-12})


# ---- preconditions ------------------------------------------------------------------------


def _lower(op, args, **attrs):
    model, _ = node_model(op, args, [(np.float32, 0)], **attrs)
    return lower(load_graph(model))


def test_unknown_reduction_is_refused():
    x, t = np.zeros((2, 3), np.float32), np.zeros((2,), np.int64)
    with pytest.raises(polyonnx.LoweringError, match=r"'negativeloglikelihoodloss_node'.*'max'"):
        _lower("NegativeLogLikelihoodLoss", [x, t], reduction="max")


def test_weight_must_have_one_entry_per_class():
    x, t = np.zeros((2, 3), np.float32), np.zeros((2,), np.int64)
    with pytest.raises(polyonnx.LoweringError, match=r"vector of 3 class weights"):
        _lower("NegativeLogLikelihoodLoss", [x, t, const(np.ones(4, np.float32))])


def test_target_shape_must_match_scores():
    x, t = np.zeros((2, 3, 4), np.float32), const(np.zeros((2, 5), np.int64))
    with pytest.raises(polyonnx.LoweringError, match=r"target of shape \[2, 5\] does not match"):
        _lower("SoftmaxCrossEntropyLoss", [x, t])


def test_scores_must_be_floats():
    x, t = np.zeros((2, 3), np.int32), np.zeros((2,), np.int64)
    with pytest.raises(polyonnx.LoweringError, match=r"scores have dtype int32"):
        _lower("SoftmaxCrossEntropyLoss", [x, t])
