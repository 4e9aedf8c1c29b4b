"""Export a BERT-base-shaped nn.TransformerEncoder (optionally causal) to ONNX, for
perf/symbolic_sequence.py (needs torch: pip install torch==2.13.0 onnxscript).

Torchscript (opset 17, the default) or dynamo (opset 18, torch.export Dims) exporter, with
dynamic batch and seq axes, saved as ir_version 10 so onnxruntime reads it. Weights over
64 MB go to <out>.data, so the 2 GB protobuf limit never bites.

    python perf/export_encoder.py --layers 12 --hidden 768 --heads 12 --ffn 3072 \
        --exporter dynamo --out bert_base_dynamo.onnx
    python perf/export_encoder.py ... --exporter dynamo --causal --out gpt2_dynamo.onnx

The torchscript exporter bakes the example seq length (16) into nn.MultiheadAttention's
reshape (pytorch#110347); the dynamo exporter keeps it dynamic.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import onnx
import torch
from torch import nn


class Encoder(nn.Module):
    """A batch-first GELU TransformerEncoder; with ``causal`` each token attends only to
    itself and earlier tokens, the mask built from x's sequence length at run time."""

    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, causal: bool):
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            hidden, heads, ffn, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        # The clones share one init; give each its own.
        for clone in self.encoder.layers:
            for m in clone.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
            clone.self_attn._reset_parameters()
        self.causal = causal

    def forward(self, x):
        if not self.causal:
            return self.encoder(x)
        return self.encoder(x, mask=causal_mask(x), is_causal=True)


def causal_mask(x: torch.Tensor) -> torch.Tensor:
    """The [seq, seq] square subsequent mask (-inf above the diagonal) for x's length; the
    tracer records x.size(1), so the exported graph builds it from the input's shape."""
    return nn.Transformer.generate_square_subsequent_mask(x.size(1), dtype=x.dtype)


EXTERNAL_BYTES = 64 << 20  # weights above this go to <out>.data


def example(hidden: int) -> torch.Tensor:
    """The [2, 16, hidden] trace input; batch and seq are not 0 or 1, so neither specialises."""
    return torch.randn(2, 16, hidden, generator=torch.Generator().manual_seed(1))


def export_torchscript(model: nn.Module, x: torch.Tensor, path: pathlib.Path) -> None:
    """Torchscript exporter, opset 17, batch and seq declared dynamic (seq gets baked)."""
    torch.onnx.export(
        model, (x,), str(path), dynamo=False, opset_version=17,
        input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}},
    )  # fmt: skip


def export_dynamo(model: nn.Module, x: torch.Tensor, path: pathlib.Path) -> None:
    """Dynamo exporter, opset 18, batch and seq as torch.export Dims (seq stays symbolic)."""
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("seq", min=1, max=4096)
    program = torch.onnx.export(
        model, (x,), dynamo=True, opset_version=18,
        input_names=["x"], output_names=["y"],
        dynamic_shapes={"x": {0: batch, 1: seq}},
    )  # fmt: skip
    program.save(str(path), external_data=True)


EXPORTERS = {"torchscript": export_torchscript, "dynamo": export_dynamo}


def export(model: nn.Module, hidden: int, out: pathlib.Path, exporter: str) -> None:
    """Export with the chosen exporter and re-save as ir_version 10, weights external if large."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "m.onnx"
        EXPORTERS[exporter](model, example(hidden), path)
        proto = onnx.load(str(path))
    proto.ir_version = 10
    large = sum(t.ByteSize() for t in proto.graph.initializer) > EXTERNAL_BYTES
    out.with_suffix(".data").unlink(missing_ok=True)
    location = out.with_suffix(".data").name
    onnx.save_model(proto, str(out), save_as_external_data=large, location=location)
    onnx.checker.check_model(str(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("layers", "hidden", "heads", "ffn"):
        ap.add_argument(f"--{name}", type=int, required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--exporter", choices=sorted(EXPORTERS), default="torchscript")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = Encoder(a.layers, a.hidden, a.heads, a.ffn, a.causal).eval()
    # Not under no_grad: that would take the fused _transformer_encoder_layer_fwd fast path.
    export(model, a.hidden, a.out, a.exporter)
    print(f"exported {a.out}")


if __name__ == "__main__":
    main()
