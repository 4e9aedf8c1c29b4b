"""Merge what a graph computes twice: equal constants, then equal nodes.

Two constants of the same dtype, shape and bytes become one; then a node whose op,
attributes and inputs equal an earlier node's is dropped and its outputs read from the
earlier node's. Exported models repeat both more than one would think (onnxruntime does
the same, as common subexpression elimination): light Inception-v2 runs 9 convolutions
twice, on filled weights. A node stays when an output is a graph output, when its op is
random, or when an attribute is a subgraph.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from polyonnx.frontend.fold import NONDETERMINISTIC_OPS
from polyonnx.frontend.graph import AttrValue, Graph, Node


def merge_duplicates(graph: Graph) -> Graph:
    """``graph`` with equal constants and equal nodes merged (itself if there are none)."""
    keep_outputs = {v.name for v in graph.outputs}
    alias = {n: m for n, m in _equal_constants(graph.constants).items() if n not in keep_outputs}
    kept: list[Node] = []
    seen: dict[Hashable, Node] = {}
    for node in graph.nodes:
        node = replace(node, inputs=tuple(alias.get(n, n) for n in node.inputs))
        key = _key(node)
        earlier = seen.get(key) if key is not None else None
        if earlier is not None and not keep_outputs.intersection(node.outputs):
            alias.update((n, m) for n, m in zip(node.outputs, earlier.outputs, strict=True) if n)
            continue
        if key is not None:
            seen.setdefault(key, node)
        kept.append(node)
    if len(kept) == len(graph.nodes) and not alias:
        return graph
    used = {n for node in kept for n in node.inputs} | keep_outputs
    constants = {n: a for n, a in graph.constants.items() if n in used or n not in alias}
    values = {n: v for n, v in graph.values.items() if n not in alias}
    return replace(
        graph,
        nodes=tuple(kept),
        constants=MappingProxyType(constants),
        values=MappingProxyType(values),
    )


def _equal_constants(constants: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Each constant equal to an earlier one (same dtype, shape and bytes) → that one."""
    by_kind: dict[tuple, list[str]] = {}
    for name, array in constants.items():
        by_kind.setdefault((array.dtype.str, array.shape), []).append(name)
    alias: dict[str, str] = {}
    for names in by_kind.values():
        if len(names) < 2 or constants[names[0]].dtype == object:
            continue
        first: dict[bytes, str] = {}
        for name in names:
            array = np.ascontiguousarray(constants[name])
            digest = hashlib.blake2b(array.view(np.uint8).data, digest_size=16).digest()
            match = first.setdefault(digest, name)
            if match != name and np.array_equal(constants[match], array, equal_nan=False):
                alias[name] = match
    return alias


def _key(node: Node) -> Hashable | None:
    """What makes two nodes compute the same, or None when merging is not allowed."""
    if node.op_type in NONDETERMINISTIC_OPS or not node.outputs:
        return None
    attrs = []
    for name in sorted(node.attrs):
        frozen = _frozen(node.attrs[name])
        if frozen is None:
            return None
        attrs.append((name, frozen))
    present = tuple(bool(n) for n in node.outputs)  # which optional outputs it has
    return (node.domain, node.op_type, node.opset, node.inputs, present, tuple(attrs))


def _frozen(value: AttrValue) -> Hashable | None:
    """A hashable stand-in for an attribute value; None for a subgraph (or anything else
    not a number, string, tensor or tuple of those)."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return None
        return ("tensor", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, tuple):
        items = tuple(_frozen(v) for v in value)
        return None if any(i is None for i in items) else ("tuple", items)
    if isinstance(value, float):
        return ("float", value.hex())  # -0.0 is not 0.0, and a NaN equals itself
    if isinstance(value, bool | int | str | bytes):
        return (type(value).__name__, value)
    return None
