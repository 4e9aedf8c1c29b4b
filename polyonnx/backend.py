"""``onnx.backend.base.Backend`` for polyonnx, shaped like ``onnxruntime.backend``:
``prepare(model).run(inputs)`` returns the outputs; ``run_model``, ``run_node`` and
``supports_device`` are module-level too. This is what the ONNX conformance suite drives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from polyonnx.errors import ArgumentError, InputError, ModelError, describe
from polyonnx.inference import InferenceSession


class PolyonnxRep(BackendRep):
    """A prepared model: compiled once, run many times."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The outputs for ``inputs``: a list or tuple of arrays in the model's input
        order, a dict of name -> array, or one array for a one-input model. ``kwargs`` are
        accepted for onnx's runner (as onnxruntime.backend does) and not used."""
        names = [arg.name for arg in self.session.get_inputs()]
        if isinstance(inputs, Mapping):
            feed = dict(inputs)
        elif isinstance(inputs, np.ndarray | np.generic) and len(names) == 1:
            feed = {names[0]: inputs}
        elif isinstance(inputs, list | tuple):
            if len(inputs) != len(names):
                raise InputError(
                    f"the model takes {len(names)} input(s) {names}, given {len(inputs)}"
                )
            feed = dict(zip(names, inputs, strict=True))
        else:
            raise InputError(
                f"inputs must be a list of arrays (for the model's inputs {names}), a dict "
                f"of name -> array, or one array for a one-input model; given {describe(inputs)}"
            )
        return tuple(self.session.run(None, feed))


class PolyonnxBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return isinstance(device, str) and device.upper().startswith("CPU")

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto | str | bytes, device: str = "CPU", **kwargs: Any
    ) -> PolyonnxRep:
        """A session for ``model`` on ``device`` (the CPU); ``threads`` is the one keyword
        used, others (onnx's runner passes rtol, atol) are accepted and ignored, as
        onnxruntime.backend ignores the options it does not know."""
        if not cls.supports_device(device):
            raise ArgumentError(f"polyonnx compiles for the CPU only, given device {device!r}")
        return PolyonnxRep(InferenceSession(model, threads=kwargs.get("threads")))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        """Run one node by wrapping it in a one-node model: ``inputs`` are arrays, one per
        named input of the node; ``outputs_info`` (dtype, shape) per output, else inferred."""
        if not isinstance(node, onnx.NodeProto):
            raise ModelError(f"run_node takes an onnx.NodeProto, given {describe(node)}")
        names = [n for n in node.input if n]
        arrays = _node_inputs(node, names, inputs)
        graph_inputs = [
            helper.make_tensor_value_info(n, _tensor_type(a.dtype, f"input {n!r}"), a.shape)
            for n, a in zip(names, arrays, strict=True)
        ]
        opset = _opset(kwargs.get("opset_version"))
        if outputs_info is None or (isinstance(outputs_info, list | tuple) and not outputs_info):
            outs = _inferred_outputs(node, graph_inputs, opset)
        else:
            outs = _declared_outputs(node, outputs_info)
        graph = helper.make_graph([node], "run_node", graph_inputs, outs)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10
        )
        return cls.run_model(model, dict(zip(names, arrays, strict=True)), device, **kwargs)


def _node_inputs(node: onnx.NodeProto, names: list[str], inputs: Any) -> list[np.ndarray]:
    """``inputs`` checked: a list or tuple of arrays, one per named input of ``node``."""
    if not isinstance(inputs, list | tuple):
        raise InputError(
            f"run_node takes a list of arrays for {node.op_type}'s inputs {names}, "
            f"given {describe(inputs)}"
        )
    if len(inputs) != len(names):
        raise InputError(
            f"{node.op_type} has {len(names)} named input(s) {names}, given {len(inputs)} arrays"
        )
    for name, array in zip(names, inputs, strict=True):
        if not isinstance(array, np.ndarray | np.generic):
            raise InputError(f"input {name!r}: expected a numpy.ndarray, given {describe(array)}")
    return [np.asarray(a) for a in inputs]


def _tensor_type(dtype: object, what: str) -> int:
    """The ONNX element type of a numpy ``dtype``; InputError if it has none."""
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{what}: dtype {describe(dtype)} has no ONNX type ({exc})") from None


def _opset(version: object) -> int:
    newest = onnx.defs.onnx_opset_version()
    if version is None:
        return newest
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= newest:
        raise ArgumentError(
            f"opset_version must be an int from 1 to {newest} (this onnx's newest), "
            f"given {describe(version)}"
        )
    return version


def _declared_outputs(node: onnx.NodeProto, outputs_info: Any) -> list[onnx.ValueInfoProto]:
    """``outputs_info`` checked: a (dtype, shape) pair per output of ``node``."""
    if not isinstance(outputs_info, list | tuple) or len(outputs_info) > len(node.output):
        raise ArgumentError(
            f"outputs_info must be a list of (dtype, shape), one per output of "
            f"{node.op_type} {list(node.output)}, given {describe(outputs_info)}"
        )
    outs = []
    for name, info in zip(node.output, outputs_info, strict=False):
        if not isinstance(info, list | tuple) or len(info) != 2:
            raise ArgumentError(
                f"outputs_info for {name!r} must be (dtype, shape), given {describe(info)}"
            )
        dtype, shape = info
        if not isinstance(shape, list | tuple) or not all(
            isinstance(d, int | str | None) and not isinstance(d, bool) for d in shape
        ):
            raise ArgumentError(
                f"outputs_info for {name!r}: shape must be a list of int, str or None dims, "
                f"given {describe(shape)}"
            )
        elem = _tensor_type(dtype, f"outputs_info for {name!r}")
        outs.append(helper.make_tensor_value_info(name, elem, shape))
    return outs


def _inferred_outputs(node: onnx.NodeProto, graph_inputs, opset: int):
    probe = helper.make_graph([node], "probe", graph_inputs, [])
    model = helper.make_model(probe, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    try:
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    except Exception as exc:  # onnx's inference refuses the node: say so, as ModelError
        raise ModelError(f"onnx cannot infer the outputs of {node.op_type}: {exc}") from exc
    outs = []
    for name in node.output:
        if name not in inferred:
            raise InputError(
                f"cannot infer the type of output {name!r} of {node.op_type}; pass outputs_info"
            )
        outs.append(inferred[name])
    return outs


prepare = PolyonnxBackend.prepare
run_model = PolyonnxBackend.run_model
run_node = PolyonnxBackend.run_node
supports_device = PolyonnxBackend.supports_device
is_compatible = PolyonnxBackend.is_compatible
