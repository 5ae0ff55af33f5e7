"""The exported classifier also as ONNX (`python -m experiments.export --onnx`): DIR/model.onnx,
transformers' model of DIR traced by torch.onnx, inputs as DIR's tokenizer names them
(input_ids, attention_mask, and token_type_ids where the family has them), each [batch, length]
int64 with both axes free; output logits [batch, classes].

attn has no torch: this needs torch, transformers and onnx (and onnxscript, torch.onnx's
exporter) in the running Python, and says so in one line when they are missing; nothing here is
imported before --onnx asks for it.
"""

import importlib.util
import json
import pathlib

from experiments.errors import UserError

FILE = "model.onnx"
NEEDS = ("torch", "transformers", "onnx", "onnxscript")


def check_available() -> None:
    """UserError in one line naming what --onnx needs and this Python lacks."""
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"--onnx needs {', '.join(NEEDS)} in this Python, which lacks {', '.join(missing)}: "
            f"pip install {' '.join(missing)}, or export without --onnx"
        )


def write(directory: pathlib.Path) -> pathlib.Path:
    """Writes DIR/model.onnx for the transformers model directory DIR; returns its path."""
    check_available()
    import torch
    import transformers

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        directory, trust_remote_code="auto_map" in config
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    example = dict(tokenizer(["an example text", "another"], padding=True, return_tensors="pt"))
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    path = directory / FILE
    torch.onnx.export(
        model,
        (),
        str(path),
        kwargs=example,
        input_names=list(example),
        output_names=["logits"],
        dynamic_shapes={name: {0: batch, 1: length} for name in example},
        dynamo=True,
    )
    return path
