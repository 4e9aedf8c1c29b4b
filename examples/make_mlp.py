"""Build examples/mlp.onnx: Gemm→Relu→Gemm→Relu→Gemm→Softmax, batch 8, 784→512→256→10.

Run ``python examples/make_mlp.py`` to regenerate it (fixed seed, so the file is stable).
"""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_mlp(batch: int | str = 8, sizes=(784, 512, 256, 10), seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "input"
    for layer, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{layer}"), numpy_helper.from_array(b, f"b{layer}")]
        y = f"fc{layer}"
        nodes.append(helper.make_node("Gemm", [x, f"w{layer}", f"b{layer}"], [y], name=y))
        x = y
        if layer < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [y], [f"relu{layer}"], name=f"relu{layer}"))
            x = f"relu{layer}"
    nodes.append(helper.make_node("Softmax", [x], ["probs"], name="softmax", axis=-1))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, sizes[-1]])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("mlp.onnx")
    onnx.save(make_mlp(), out)
    print(f"wrote {out}")
