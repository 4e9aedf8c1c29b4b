"""Export the tiny transformers models whose .onnx files tests/models/test_transformers.py runs.

Regenerate (not run in CI; the tests need only the committed .onnx files):

    pip install torch==2.13.0 onnxscript transformers==5.25.0   # for exporting only
    python tests/data/transformers/export_models.py

Exported with torch 2.13.0+cpu, transformers 5.25.0, onnx 1.23.2. Each model is built from a
config with seeded random weights (nothing is downloaded), exported by torch's dynamo
exporter at opset 18 with ``input_ids`` and ``attention_mask`` of dynamic batch and seq, as
a newcomer would export them. Their padding masks are built with GatherND over the mask.
``max_position_embeddings`` is 128: the sizes a parametric compile lowers at go to 127.
"""

from __future__ import annotations

import pathlib

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel

HERE = pathlib.Path(__file__).resolve().parent
CONFIGS = {
    "bert": lambda: BertModel(
        BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
        )
    ),
    "gpt2": lambda: GPT2Model(
        GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=128)
    ),
    "llama": lambda: LlamaModel(
        LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            max_position_embeddings=128,
        )
    ),
}


class LastHidden(torch.nn.Module):
    """The model's last hidden state from ids and a padding mask, with no KV cache."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state


def export(name: str) -> None:
    torch.manual_seed(0)
    model = LastHidden(CONFIGS[name]()).eval()
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dims = {0: batch, 1: seq}
    torch.onnx.export(
        model,
        (ids, mask),
        HERE / f"{name}_dynamo.onnx",
        dynamo=True,
        opset_version=18,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_shapes={"input_ids": dims, "attention_mask": dims},
    )


if __name__ == "__main__":
    for name in CONFIGS:
        export(name)
