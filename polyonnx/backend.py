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

from polyonnx.errors import InputError
from polyonnx.inference import InferenceSession


class PolyonnxRep(BackendRep):
    """A prepared model: compiled once, run many times."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = [arg.name for arg in self.session.get_inputs()]
        if isinstance(inputs, Mapping):
            feed = dict(inputs)
        elif isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            feed = {names[0]: inputs} if names else {}
        else:
            if len(inputs) != len(names):
                raise InputError(
                    f"the model takes {len(names)} input(s) {names}, given {len(inputs)}"
                )
            feed = dict(zip(names, inputs, strict=True))
        return tuple(self.session.run(None, feed))


class PolyonnxBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto | str | bytes, device: str = "CPU", **kwargs: Any
    ) -> PolyonnxRep:
        if not cls.supports_device(device):
            raise ValueError(f"polyonnx compiles for the CPU only, not {device!r}")
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
        """Run one node by wrapping it in a one-node model."""
        arrays = [np.asarray(x) for x in inputs]
        names = [n for n in node.input if n]
        graph_inputs = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays, strict=False)
        ]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        if outputs_info:
            outs = [
                helper.make_tensor_value_info(
                    n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape
                )
                for n, (dt, shape) in zip(node.output, outputs_info, strict=False)
            ]
        else:
            outs = _inferred_outputs(node, graph_inputs, opset)
        graph = helper.make_graph([node], "run_node", graph_inputs, outs)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10
        )
        return cls.run_model(model, dict(zip(names, arrays, strict=False)), device, **kwargs)


def _inferred_outputs(node: onnx.NodeProto, graph_inputs, opset: int):
    probe = helper.make_graph([node], "probe", graph_inputs, [])
    model = helper.make_model(probe, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
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
