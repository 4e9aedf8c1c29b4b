"""The frontend's output: an immutable, typed graph that no longer needs protobufs.

Every later stage reads a :class:`Graph`; only ``polyonnx.frontend`` touches ONNX protos.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

Dim = int | str
"""A tensor dimension: a known size, or the name of a symbolic (dynamic) size."""

AttrValue = int | float | str | bytes | tuple | np.ndarray
"""A node attribute: scalars, tuples of scalars, or a tensor as a numpy array."""


@dataclass(frozen=True)
class Value:
    """A typed tensor of the graph: its name, shape (ints or symbols) and numpy dtype name."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)


@dataclass(frozen=True)
class Node:
    """One ONNX node. Missing optional inputs are the empty string, as in ONNX."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, AttrValue] = field(default_factory=lambda: MappingProxyType({}))
    domain: str = ""
    opset: int = 0
    """The opset version in force for this node's domain."""

    def attr(self, name: str, default: AttrValue | None = None) -> AttrValue | None:
        return self.attrs.get(name, default)

    def input(self, index: int) -> str:
        """The name of input ``index``, or '' when it is absent."""
        return self.inputs[index] if index < len(self.inputs) else ""


@dataclass(frozen=True)
class Graph:
    """A whole model after loading, checking, shape inference and constant folding.

    ``nodes`` are in topological order. ``values`` types every tensor (graph inputs,
    intermediates, outputs and constants). ``constants`` holds initializers and every
    tensor that constant folding computed; constants are never graph inputs.
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    values: Mapping[str, Value]
    constants: Mapping[str, np.ndarray]
    opset: int
    """The default-domain opset version the model imports."""

    def value(self, name: str) -> Value:
        return self.values[name]

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    @property
    def is_static(self) -> bool:
        return all(v.is_static for v in self.inputs)
