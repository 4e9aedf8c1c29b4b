"""ONNX → Graph: load, check, infer shapes, fold constants. The only reader of protobufs."""

from polyonnx.frontend.graph import Graph, Node, Value
from polyonnx.frontend.load import load_graph, load_model

__all__ = ["Graph", "Node", "Value", "load_graph", "load_model"]
