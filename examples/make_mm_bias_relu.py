"""Build examples/mm_bias_relu.onnx: y = Relu(x @ w + b), the model of docs/schedule.md.

x is [256, 512] (the graph input), w is [512, 384] and b is [384] (initializers); the
nodes are named ``mm`` (MatMul), ``bias`` (Add) and ``relu`` (Relu), which are the kernel
names a schedule script uses. Run ``python examples/make_mm_bias_relu.py`` to regenerate
it (fixed seed, so the file is stable).
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_mm_bias_relu(m: int = 256, k: int = 512, n: int = 384, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = (rng.standard_normal(n) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
        helper.make_node("Add", ["t", "b"], ["u"], name="bias"),
        helper.make_node("Relu", ["u"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "mm_bias_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("mm_bias_relu.onnx")
    onnx.save(make_mm_bias_relu(), out)
    print(f"wrote {out}")
