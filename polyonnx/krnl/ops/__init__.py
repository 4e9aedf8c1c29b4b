"""One module per op family; importing them registers their lowerings."""

from polyonnx.krnl.ops import elementwise, matmul, reduce, softmax, views

__all__ = ["elementwise", "matmul", "reduce", "softmax", "views"]
