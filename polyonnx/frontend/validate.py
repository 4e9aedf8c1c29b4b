"""Check node attributes against the ONNX spec at load, before folding or lowering.

ONNX's checker validates attribute *types*, and non-strict shape inference skips a node
whose attributes it cannot make sense of, so an illegal value (Transpose perm [0, 5],
Gather axis -5 on rank 2, negative Conv pads, ReduceSum keepdims=5) would otherwise reach
a lowering that clamps, wraps or ignores it. ``CHECKS`` maps op types to checks; each
yields what is wrong with a node, and :func:`validate_nodes` raises one ModelError that
lists every problem of the model, naming node, op and attribute. Checks that need a rank
or a value skip when inference or folding has not found it; they run again every folding
round. Legal is what the ONNX spec (and onnx.reference) accepts; where the spec is silent
and onnxruntime refuses (Pad reflect wider than the dim), polyonnx refuses too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from polyonnx.errors import ModelError
from polyonnx.frontend.budget import KNOWN_DTYPES, Types, value_dims
from polyonnx.frontend.limits import Limits

Problems = Iterator[str]

BOOL_ATTRS = frozenset(
    {
        "keepdims",
        "select_last_index",
        "ceil_mode",
        "count_include_pad",
        "exclusive",
        "reverse",
        "transA",
        "transB",
        "noop_with_empty_axes",
        "largest",
        "sorted",
        "allowzero",
        "upper",
        "training_mode",
        "detect_negative",
        "detect_positive",
        "exclude_outside",
        "fmod",
        "center_point_box",
        "antialias",
        "storage_order",
        "input_forget",
        "layout",
        "saturate",
        "interleaved",
        "is_causal",
    }
)
"""Default-domain int attributes that are flags: 0 or 1, whatever the op."""

GEOMETRY_ATTRS = ("pads", "strides", "dilations", "kernel_shape", "output_padding", "output_shape")
"""Conv/pool attributes bounded by ``Limits.max_dim`` so index arithmetic stays 64-bit safe."""

CONSTANT_VALUES = (
    "value",
    "sparse_value",
    "value_float",
    "value_floats",
    "value_int",
    "value_ints",
    "value_string",
    "value_strings",
)


@dataclass(frozen=True)
class Site:
    """One node with what is known about its inputs: constant values and inferred types."""

    node: onnx.NodeProto
    attrs: Mapping[str, object]
    constants: Mapping[str, np.ndarray]
    types: Types
    opset: int
    limits: Limits

    def name(self, index: int) -> str:
        return self.node.input[index] if index < len(self.node.input) else ""

    def value(self, index: int) -> np.ndarray | None:
        name = self.name(index)
        return self.constants.get(name) if name else None

    def ints(self, index: int) -> list[int] | None:
        value = self.value(index)
        if value is None or value.dtype.kind not in "iu":
            return None
        return [int(v) for v in value.reshape(-1)]

    def dims(self, index: int) -> list[int | None] | None:
        """Input ``index``'s dims (None per unknown dim), or None when its rank is unknown."""
        return value_dims(self.name(index), self.constants, self.types)

    def rank(self, index: int) -> int | None:
        dims = self.dims(index)
        return None if dims is None else len(dims)

    def attr_or_input(self, attr: str, index: int, since: int) -> list[int] | None:
        """A list given as attribute ``attr`` before opset ``since``, as input ``index``
        from then on (Reduce axes, Squeeze axes, Pad pads, Split split)."""
        if self.opset < since:
            value = self.attrs.get(attr)
            return None if value is None else [int(v) for v in value]
        return self.ints(index)


def validate_nodes(
    nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, np.ndarray],
    types: Types,
    opsets: Mapping[str, int],
    limits: Limits,
) -> None:
    """Raise one ModelError listing every attribute problem of ``nodes``."""
    problems = []
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: _attr(a) for a in node.attribute}
        site = Site(node, attrs, constants, types, opsets.get("", 0), limits)
        for check in [_check_flags, _check_geometry_bounds, *CHECKS.get(node.op_type, ())]:
            for why in check(site):
                problems.append(f"{node.op_type} node {node.name!r}: {why}")
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise ModelError(f"the model has {len(problems)} malformed node(s):\n  {shown}{more}")


def _attr(attr: onnx.AttributeProto) -> object:
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return None  # subgraphs are not read here, and not copied
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


# ---- checks for every op -------------------------------------------------------------------


def _check_flags(site: Site) -> Problems:
    for name in BOOL_ATTRS & site.attrs.keys():
        value = site.attrs[name]
        if isinstance(value, int) and value not in (0, 1):
            yield f"attribute {name!r} is {value}; it is a flag, 0 or 1"


def _check_geometry_bounds(site: Site) -> Problems:
    bound = site.limits.max_dim
    for name in GEOMETRY_ATTRS:
        values = site.attrs.get(name)
        if isinstance(values, list) and any(abs(int(v)) > bound for v in values):
            yield (
                f"attribute {name!r} = {list(values)} has a value beyond {bound} "
                "(Limits.max_dim, docs/limits.md)"
            )


def _axis_in(axis: int, rank: int | None, what: str, extra: int = 0) -> Problems:
    """``axis`` within [-(rank + extra), rank + extra)."""
    if rank is None:
        return
    low, high = -(rank + extra), rank + extra
    if not low <= axis < high:
        yield f"{what} {axis} is out of range [{low}, {high - 1}] for rank {rank}"


def _axes_in(axes: Sequence[int], rank: int | None, what: str, extra: int = 0) -> Problems:
    if rank is None:
        return
    for axis in axes:
        yield from _axis_in(axis, rank, f"{what} {list(axes)}: axis", extra)
    size = rank + extra
    if size and len({a % size for a in axes}) < len(axes):
        yield f"{what} {list(axes)} repeats an axis"


def axis_check(attr: str = "axis", index: int = 0, extra: int = 0, default: int | None = 0):
    """Attribute ``attr`` (``default`` when absent) is an axis of input ``index``."""

    def check(site: Site) -> Problems:
        axis = site.attrs.get(attr, default)
        if axis is not None:
            yield from _axis_in(int(axis), site.rank(index), f"attribute {attr!r}", extra)

    return check


ALWAYS_ATTRIBUTE = 1 << 30
"""``since`` for a list that is an attribute in every opset."""


def axes_check(attr: str, index: int, since: int):
    """A list of axes of input 0: attribute ``attr`` before opset ``since``, input
    ``index`` from then on."""

    def check(site: Site) -> Problems:
        axes = site.attr_or_input(attr, index, since)
        if axes is not None:
            what = f"attribute {attr!r}" if site.opset < since else f"input {attr!r}"
            yield from _axes_in(axes, site.rank(0), what)

    return check


# ---- per-op checks -------------------------------------------------------------------------


def _check_transpose(site: Site) -> Problems:
    perm = site.attrs.get("perm")
    if perm is None:
        return
    rank = site.rank(0)
    size = len(perm) if rank is None else rank
    if sorted(int(p) for p in perm) != list(range(size)):
        yield f"attribute 'perm' = {list(perm)} is not a permutation of 0..{size - 1}"


def _check_constant(site: Site) -> Problems:
    given = [name for name in CONSTANT_VALUES if name in site.attrs]
    others = sorted(set(site.attrs) - set(CONSTANT_VALUES))
    if len(given) != 1:
        yield f"needs exactly one value attribute of {list(CONSTANT_VALUES)}, has {given or 'none'}"
    if others:
        yield f"has unknown attribute(s) {others}"


def _check_concat(site: Site) -> Problems:
    inputs = [i for i, name in enumerate(site.node.input) if name]
    dims = {i: site.dims(i) for i in inputs}
    known = {i: d for i, d in dims.items() if d is not None}
    if "axis" not in site.attrs:
        yield "has no 'axis' attribute"
    scalars = [site.name(i) for i, d in known.items() if not d]
    if scalars:
        yield f"concatenates scalar(s) {scalars}; every input needs rank >= 1"
        return
    ranks = {len(d) for d in known.values()}
    if len(ranks) > 1:
        yield f"inputs have different ranks {[len(d) for d in known.values()]}"
        return
    if not known or "axis" not in site.attrs:
        return
    rank = ranks.pop()
    axis = int(site.attrs["axis"])
    bad = list(_axis_in(axis, rank, "attribute 'axis'"))
    yield from bad
    if bad:
        return
    for r in range(rank):
        if r == axis % rank:
            continue
        sizes = {d[r] for d in known.values() if d[r] is not None}
        if len(sizes) > 1:
            yield f"inputs differ in dim {r} ({sorted(sizes)}), which is not the axis {axis}"


def _conv_spatial(site: Site, weight: int | None) -> int | None:
    rank = site.rank(0)
    if rank is None and weight is not None:
        rank = site.rank(weight)
    if rank is None and "kernel_shape" in site.attrs:
        return len(site.attrs["kernel_shape"])
    return None if rank is None else rank - 2


def conv_check(weight: int | None, transposed: bool = False):
    """Conv, ConvTranspose, ConvInteger, QLinearConv and the pools: geometry attributes
    of the right length and sign, and channels that divide into groups."""

    def check(site: Site) -> Problems:
        spatial = _conv_spatial(site, weight)
        yield from _geometry(site, spatial)
        if weight is not None:
            yield from _groups(site, weight, transposed)
        if transposed:
            yield from _output_padding(site, spatial)

    return check


def _geometry(site: Site, spatial: int | None) -> Problems:
    if spatial is not None and spatial < 0:
        yield f"input of rank {site.rank(0)} has no channel and spatial dims"
        return
    wanted = {"kernel_shape": 1, "strides": 1, "dilations": 1, "pads": 2}
    for name, per_axis in wanted.items():
        values = site.attrs.get(name)
        if values is None:
            continue
        values = [int(v) for v in values]
        if spatial is not None and len(values) != per_axis * spatial:
            yield f"attribute {name!r} = {values} needs {per_axis * spatial} values"
        low = 0 if name == "pads" else 1
        if any(v < low for v in values):
            sign = "non-negative" if low == 0 else "positive"
            yield f"attribute {name!r} = {values} must be {sign}"
    auto_pad = site.attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        yield f"attribute 'auto_pad' = {auto_pad!r} is not NOTSET, SAME_UPPER, SAME_LOWER or VALID"


def _groups(site: Site, weight: int, transposed: bool) -> Problems:
    group = int(site.attrs.get("group", 1))
    if group < 1:
        yield f"attribute 'group' = {group} must be positive"
        return
    x, w = site.dims(0), site.dims(weight)
    if x is None or w is None or len(x) < 2 or len(w) < 2:
        return
    if len(x) != len(w):
        yield f"input of rank {len(x)} and weight of rank {len(w)} differ"
        return
    channels = x[1]
    if channels is not None and channels % group:
        yield f"{channels} input channels do not divide into group = {group}"
    if transposed:
        if channels is not None and w[0] is not None and w[0] != channels:
            yield f"weight has {w[0]} input channels, the input has {channels}"
        return
    if w[0] is not None and w[0] % group:
        yield f"{w[0]} output channels do not divide into group = {group}"
    if channels is not None and w[1] is not None and w[1] * group != channels:
        yield f"weight takes {w[1]} x group {group} channels, the input has {channels}"
    kernel = site.attrs.get("kernel_shape")
    if kernel is not None and None not in w[2:] and list(kernel) != w[2:]:
        yield f"attribute 'kernel_shape' = {list(kernel)} differs from the weight's {w[2:]}"


def _output_padding(site: Site, spatial: int | None) -> Problems:
    padding = site.attrs.get("output_padding")
    if padding is not None:
        padding = [int(v) for v in padding]
        count = len(padding) if spatial is None else spatial
        strides = [int(v) for v in site.attrs.get("strides", [1] * count)]
        dilations = [int(v) for v in site.attrs.get("dilations", [1] * count)]
        if len(padding) != count:
            yield f"attribute 'output_padding' = {padding} needs {count} values"
        elif any(p < 0 for p in padding):
            yield f"attribute 'output_padding' = {padding} must be non-negative"
        elif len(strides) == len(dilations) == count:
            for axis, (p, s, d) in enumerate(zip(padding, strides, dilations, strict=True)):
                if p >= max(s, d):
                    yield (
                        f"attribute 'output_padding' = {padding}: {p} on axis {axis} is not "
                        f"below its stride {s} or dilation {d}"
                    )
    shape = site.attrs.get("output_shape")
    if shape is not None and any(int(v) < 0 for v in shape):
        yield f"attribute 'output_shape' = {list(shape)} must be non-negative"


def _check_pad(site: Site) -> Problems:
    mode = site.attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        yield f"attribute 'mode' = {mode!r} is not constant, reflect, edge or wrap"
        return
    if site.opset < 11:
        pads = site.attrs.get("pads", site.attrs.get("paddings"))
        pads = None if pads is None else [int(p) for p in pads]
    else:
        pads = site.ints(1)
    dims = site.dims(0)
    if pads is None or dims is None:
        return
    axes = site.ints(3) if site.opset >= 18 and site.name(3) else None
    if axes is None and site.opset >= 18 and site.name(3):
        return  # axes given at run time
    if axes is not None:
        bad = list(_axes_in(axes, len(dims), "input 'axes'"))
        yield from bad
        if bad:
            return
    axes = list(range(len(dims))) if axes is None else [a % len(dims) for a in axes]
    if len(pads) != 2 * len(axes):
        yield f"pads {pads} need {2 * len(axes)} values for {len(axes)} axes"
        return
    for i, axis in enumerate(axes):
        begin, end, size = pads[i], pads[i + len(axes)], dims[axis]
        if size is None:
            continue
        if size + begin + end < 0:
            yield f"pads {pads} crop more than the {size} elements of axis {axis}"
        elif mode == "reflect" and max(begin, end) >= max(size, 1) and max(begin, end) > 0:
            yield (
                f"reflect pads {pads} are not below the size {size} of axis {axis} "
                "(onnxruntime refuses them too)"
            )
        elif mode in ("edge", "wrap") and size == 0 and (begin > 0 or end > 0):
            yield f"{mode} pads {pads} extend the empty axis {axis}"


def _check_split(site: Site) -> Problems:
    axis = int(site.attrs.get("axis", 0))
    dims = site.dims(0)
    bad = list(_axis_in(axis, None if dims is None else len(dims), "attribute 'axis'"))
    yield from bad
    split = site.attr_or_input("split", 1, 13)
    outputs = len(site.node.output)
    if split is not None:
        if any(s < 0 for s in split):
            yield f"split {split} has a negative size"
        if len(split) != outputs:
            yield f"split {split} gives {len(split)} sizes for {outputs} outputs"
        if dims is not None and not bad and dims[axis] is not None and sum(split) != dims[axis]:
            yield f"split {split} sums to {sum(split)}, axis {axis} has {dims[axis]}"
    num = site.attrs.get("num_outputs")
    if num is not None and (int(num) < 1 or int(num) != outputs):
        yield f"attribute 'num_outputs' = {num} but the node has {outputs} outputs"


def _check_squeeze(site: Site) -> Problems:
    axes = site.attr_or_input("axes", 1, 13)
    dims = site.dims(0)
    if axes is None or dims is None:
        return
    bad = list(_axes_in(axes, len(dims), "axes"))
    yield from bad
    if bad:
        return
    for axis in axes:
        size = dims[axis % len(dims)] if dims else None
        if size is not None and size != 1:
            yield f"axes {axes}: axis {axis} has size {size}, not 1"


def _check_unsqueeze(site: Site) -> Problems:
    axes = site.attr_or_input("axes", 1, 13)
    rank = site.rank(0)
    if axes is not None and rank is not None:
        yield from _axes_in(axes, rank, "axes", len(axes))


def _check_reshape(site: Site) -> Problems:
    shape = site.ints(1) if site.opset >= 5 else site.attrs.get("shape")
    if shape is None:
        return
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        yield f"shape {shape} may hold one -1 and no other negative value"
    if int(site.attrs.get("allowzero", 0)) == 1 and -1 in shape and 0 in shape:
        yield f"shape {shape} has both 0 and -1 while allowzero = 1"


def _check_tile(site: Site) -> Problems:
    repeats, rank = site.ints(1), site.rank(0)
    if repeats is None:
        return
    if any(r < 0 for r in repeats):
        yield f"repeats {repeats} must be non-negative"
    if rank is not None and len(repeats) != rank:
        yield f"repeats {repeats} need {rank} values for an input of rank {rank}"


def _check_expand(site: Site) -> Problems:
    shape, dims = site.ints(1), site.dims(0)
    if shape is None or dims is None:
        return
    if any(s < 0 for s in shape):
        yield f"shape {shape} has a negative dim"
        return
    rank = max(len(shape), len(dims))
    padded = zip([1] * (rank - len(dims)) + dims, [1] * (rank - len(shape)) + shape, strict=True)
    for a, b in padded:
        if a is not None and a != b and 1 not in (a, b):
            yield f"input of shape {dims} does not broadcast to {shape}"
            return


def _check_gather_indices(site: Site) -> Problems:
    """Constant indices within the gathered axis (run-time indices are checked when run)."""
    indices, dims = site.value(1), site.dims(0)
    axis = int(site.attrs.get("axis", 0))
    if indices is None or dims is None or not dims or indices.dtype.kind not in "iu":
        return
    if not -len(dims) <= axis < len(dims) or dims[axis] is None or not indices.size:
        return
    size = dims[axis]
    if int(indices.min()) < -size or int(indices.max()) >= size:
        yield (
            f"constant indices range over [{int(indices.min())}, {int(indices.max())}], "
            f"outside [{-size}, {size - 1}] of axis {axis}"
        )


def _check_space_depth(site: Site) -> Problems:
    block = int(site.attrs.get("blocksize", 0))
    if block < 1:
        yield f"attribute 'blocksize' = {block} must be positive"
        return
    mode = site.attrs.get("mode", "DCR")
    if site.node.op_type == "DepthToSpace" and mode not in ("DCR", "CRD"):
        yield f"attribute 'mode' = {mode!r} is not DCR or CRD"
    dims = site.dims(0)
    if dims is None:
        return
    if len(dims) != 4:
        yield f"input has rank {len(dims)}, not 4"
        return
    if site.node.op_type == "DepthToSpace":
        if dims[1] is not None and dims[1] % (block * block):
            yield f"{dims[1]} channels do not divide by blocksize^2 = {block * block}"
    elif any(d is not None and d % block for d in dims[2:]):
        yield f"spatial dims {dims[2:]} do not divide by blocksize {block}"


RESIZE_MODES = ("nearest", "linear", "cubic", "bilinear", "trilinear")
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _check_resize(site: Site) -> Problems:
    for name, legal in (
        ("mode", RESIZE_MODES),
        ("coordinate_transformation_mode", COORDINATE_MODES),
        ("nearest_mode", NEAREST_MODES),
        ("keep_aspect_ratio_policy", ("stretch", "not_larger", "not_smaller")),
    ):
        value = site.attrs.get(name)
        if value is not None and value not in legal:
            yield f"attribute {name!r} = {value!r} is not one of {list(legal)}"
    if site.node.op_type == "Resize" and site.opset >= 11:
        scales = site.value(2)
        if scales is not None and scales.size and site.value(3) is not None and site.value(3).size:
            yield "gives both scales and sizes"
    else:
        scales = site.value(1) if "scales" not in site.attrs else np.array(site.attrs["scales"])
    if scales is not None and scales.size and not (np.asarray(scales, np.float64) > 0).all():
        yield f"scales {np.asarray(scales).tolist()} must be positive"
    sizes = site.ints(3) if site.node.op_type == "Resize" and site.opset >= 11 else None
    if sizes and any(s < 0 for s in sizes):
        yield f"sizes {sizes} must be non-negative"


def _check_cast(site: Site) -> Problems:
    to = site.attrs.get("to")
    if isinstance(to, int) and to not in KNOWN_DTYPES:
        yield f"attribute 'to' = {to} is not an ONNX tensor type"


def _check_topk(site: Site) -> Problems:
    yield from axis_check(default=-1)(site)
    k = site.ints(1) if site.opset >= 10 else [int(site.attrs.get("k", 0))]
    if k is None:
        return
    if len(k) != 1 or k[0] < 0:
        yield f"k {k} must be one non-negative value"
        return
    dims, axis = site.dims(0), int(site.attrs.get("axis", -1))
    if dims and -len(dims) <= axis < len(dims) and dims[axis] is not None and k[0] > dims[axis]:
        yield f"k = {k[0]} is larger than axis {axis} of size {dims[axis]}"


def _check_reverse_sequence(site: Site) -> Problems:
    batch = int(site.attrs.get("batch_axis", 1))
    time = int(site.attrs.get("time_axis", 0))
    if {batch, time} != {0, 1}:
        yield f"batch_axis = {batch} and time_axis = {time} must be 0 and 1, one each"


def _check_gather_nd(site: Site) -> Problems:
    batch = int(site.attrs.get("batch_dims", 0))
    ranks = [site.rank(0), site.rank(1)]
    known = [r for r in ranks if r is not None]
    if batch < 0 or (known and batch >= min(known)):
        yield f"attribute 'batch_dims' = {batch} must be in [0, min of the input ranks {known})"


def _check_lrn(site: Site) -> Problems:
    size = site.attrs.get("size")
    if size is not None and int(size) < 1:
        yield f"attribute 'size' = {size} must be positive"


def _check_cumsum(site: Site) -> Problems:
    axis = site.ints(1)
    if axis is not None:
        if len(axis) != 1:
            yield f"axis {axis} must be one value"
        else:
            yield from _axis_in(axis[0], site.rank(0), "input 'axis'")


def _check_slice(site: Site) -> Problems:
    if site.opset < 10:
        axes = site.attrs.get("axes")
        steps = None
    else:
        axes, steps = site.ints(3), site.ints(4)
    if axes is not None:
        yield from _axes_in([int(a) for a in axes], site.rank(0), "axes")
    if steps is not None and 0 in steps:
        yield f"steps {steps} may not be 0"


def _check_softmax_axis(site: Site) -> Problems:
    """From opset 13 an axis of the input; before, where it is coerced to 2D, which may
    also be at the rank itself (every dim in the batch): [-rank, rank]."""
    axis, rank = site.attrs.get("axis"), site.rank(0)
    if axis is None or rank is None:
        return
    high = rank - 1 if site.opset >= 13 else rank
    if not -rank <= int(axis) <= high:
        yield f"attribute 'axis' {int(axis)} is out of range [{-rank}, {high}] for rank {rank}"


def _check_flatten(site: Site) -> Problems:
    """Flatten's axis may also be the rank itself: [-rank, rank]."""
    axis, rank = int(site.attrs.get("axis", 1)), site.rank(0)
    if rank is not None and not -rank <= axis <= rank:
        yield f"attribute 'axis' {axis} is out of range [{-rank}, {rank}] for rank {rank}"


def _reduce_checks(since: int) -> list[Callable[[Site], Problems]]:
    return [axes_check("axes", 1, since)]


REDUCE_OPS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
)

CONV_CHECKS = {
    "Conv": [conv_check(1)],
    "ConvInteger": [conv_check(1)],
    "QLinearConv": [conv_check(3)],
    "ConvTranspose": [conv_check(1, transposed=True)],
    "MaxPool": [conv_check(None)],
    "AveragePool": [conv_check(None)],
    "LpPool": [conv_check(None)],
    "MaxUnpool": [conv_check(None)],
}

CHECKS: dict[str, list[Callable[[Site], Problems]]] = {
    **CONV_CHECKS,
    **{op: _reduce_checks(18) for op in REDUCE_OPS},
    "ReduceSum": _reduce_checks(13),
    "Transpose": [_check_transpose],
    "Constant": [_check_constant],
    "Concat": [_check_concat],
    "Gather": [axis_check(), _check_gather_indices],
    "GatherElements": [axis_check()],
    "Scatter": [axis_check()],
    "ScatterElements": [axis_check()],
    "Split": [_check_split],
    "Softmax": [_check_softmax_axis],
    "LogSoftmax": [_check_softmax_axis],
    "Hardmax": [_check_softmax_axis],
    "ArgMax": [axis_check()],
    "ArgMin": [axis_check()],
    "Flatten": [_check_flatten],
    "LpNormalization": [axis_check(default=-1)],
    "LayerNormalization": [axis_check(default=-1)],
    "Compress": [axis_check(default=None)],
    "OneHot": [axis_check(default=-1, extra=1)],
    "TopK": [_check_topk],
    "CumSum": [_check_cumsum],
    "Squeeze": [_check_squeeze],
    "Unsqueeze": [_check_unsqueeze],
    "Slice": [_check_slice],
    "Pad": [_check_pad],
    "Reshape": [_check_reshape],
    "Tile": [_check_tile],
    "Expand": [_check_expand],
    "DepthToSpace": [_check_space_depth],
    "SpaceToDepth": [_check_space_depth],
    "Resize": [_check_resize],
    "Upsample": [_check_resize],
    "Cast": [_check_cast],
    "ReverseSequence": [_check_reverse_sequence],
    "GatherND": [_check_gather_nd],
    "LRN": [_check_lrn],
    "MeanVarianceNormalization": [axes_check("axes", 0, ALWAYS_ATTRIBUTE)],
}
"""Per op type, the checks its nodes must pass (besides the flag and bound checks)."""
