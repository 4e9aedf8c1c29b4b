"""The size budget a model must fit in: per tensor bytes, elements and dims.

Every tensor a model declares or makes is checked against it at load, before anything is
allocated: initializers (dense, sparse, external), Constant values, graph inputs, every
shape that inference finds, and the outputs of Range, ConstantOfShape, Expand, Tile, Resize
and friends computed from their constant inputs. A tensor over budget raises
:class:`ModelError` naming it, instead of a raw ``MemoryError`` or the OOM killer. The
defaults and how to raise them are in docs/limits.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from polyonnx.errors import ArgumentError, ModelError

ENV_PREFIX = "POLYONNX_"
"""``Limits.max_tensor_bytes`` is overridden by ``POLYONNX_MAX_TENSOR_BYTES``, and so on."""


@dataclass(frozen=True)
class Limits:
    """The largest tensor a model may declare or compute (docs/limits.md).

    ``max_tensor_bytes``: 8 GiB, above the largest single weight of real models (a 70B
    LLM's float32 embedding is 4.2 GB) and a third of a 24 GiB machine. ``max_tensor_elements``:
    2**31, so element indices fit an int32 loop counter. ``max_dim``: 2**31 - 1 for every
    dim (and pads, strides, dilations, kernel sizes), so index arithmetic over a tensor of
    rank 8 stays within 64-bit strides in isl and in the generated code.
    """

    max_tensor_bytes: int = 8 << 30
    max_tensor_elements: int = 1 << 31
    max_dim: int = (1 << 31) - 1

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(
                    f"Limits.{field.name} must be a positive int, got {value!r} (docs/limits.md)"
                )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, each overridden by its environment variable when set."""
        environ = os.environ if environ is None else environ
        given = {}
        for field in fields(cls):
            key = ENV_PREFIX + field.name.upper()
            text = environ.get(key, "").strip()
            if not text:
                continue
            try:
                given[field.name] = int(text.replace("_", ""), 0)
            except ValueError:
                raise ArgumentError(f"{key}={text!r} is not an integer (docs/limits.md)") from None
        try:
            return cls(**given)
        except ArgumentError as exc:
            raise ArgumentError(f"{exc} (from the environment, {ENV_PREFIX}*)") from None

    def check_dims(self, dims: Sequence[int | None], itemsize: int, what: str) -> None:
        """Raise ModelError when ``dims`` (None for an unknown dim) break the budget; the
        message names ``what``."""
        problem = self.problem(dims, itemsize)
        if problem:
            raise ModelError(f"{what} {problem}")

    def problem(self, dims: Sequence[int | None], itemsize: int) -> str | None:
        """Why a tensor of ``dims`` and ``itemsize`` does not fit, or None if it does."""
        known = [int(d) for d in dims if d is not None]
        for d in known:
            if d < 0:
                return f"has a negative dim {d} (shape {_shape(dims)})"
            if d > self.max_dim:
                return (
                    f"has a dim of {d} (shape {_shape(dims)}), over the limit of "
                    f"{self.max_dim} ({_knob('max_dim')})"
                )
        if len(known) < len(dims):
            return None
        return self.count_problem(math.prod(known), itemsize, _shape(dims))

    def count_problem(self, elements: int, itemsize: int, shape: str = "") -> str | None:
        """Why ``elements`` elements of ``itemsize`` bytes are too many, or None."""
        shown = f" (shape {shape})" if shape else ""
        if elements > self.max_tensor_elements:
            return (
                f"would have {elements} elements{shown}, over the limit of "
                f"{self.max_tensor_elements} ({_knob('max_tensor_elements')})"
            )
        size = elements * max(itemsize, 1)
        if size > self.max_tensor_bytes:
            return (
                f"would take {_bytes(size)}{shown}, over the limit of "
                f"{_bytes(self.max_tensor_bytes)} ({_knob('max_tensor_bytes')})"
            )
        return None


def resolve(limits: Limits | None) -> Limits:
    """``limits``, or the defaults with the environment's overrides."""
    return Limits.from_env() if limits is None else limits


def _knob(name: str) -> str:
    return f"raise Limits.{name} or {ENV_PREFIX}{name.upper()}, docs/limits.md"


def _shape(dims: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _bytes(size: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} bytes"
