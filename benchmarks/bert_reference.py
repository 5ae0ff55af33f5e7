"""Reference outputs for `attn.bert` from Hugging Face transformers' Flax models, which attn never
imports: run this file in a separate environment that has them, e.g.

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install "transformers<5" "jax==0.10.2" "flax==0.12.8" \
        safetensors tokenizers
    /tmp/refvenv/bin/python benchmarks/bert_reference.py tiny
    /tmp/refvenv/bin/python benchmarks/bert_reference.py --model DIR/all-MiniLM-L6-v2

(transformers 4.57 is the last line with Flax models.) `tiny` writes tests/data/bert/: for a
BERT and a RoBERTa of 2 layers, hidden 32 and 4 heads with every parameter drawn at random
(biases and LayerNorms included, so a wrong mapping shows), a Hugging Face model directory
(config.json + model.safetensors in PyTorch's layout, linear weights [out, in]) and
`<name>_golden.npz`: fixed ids with padding, their mask and token types, and the reference's
last hidden states (float32, highest matmul precision). `--model DIR` writes
tests/data/bert/<DIR's name>_reference.npz: the same for a few real sentences tokenized by the
checkpoint's own tokenizer.json. Each run records the versions it ran with in versions.json.
"""

import argparse
import json
import os
import sys

import jax
import numpy as np
import safetensors
import transformers
from safetensors.numpy import save_file

jax.config.update("jax_default_matmul_precision", "highest")

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")
OUT = os.path.join(OUT, "bert")

SENTENCES = (
    "A gorgeous, witty, seductive movie that never once loses its nerve.",
    "The plot is thin and the jokes fall flat.",
    "Not bad at all.",
    "Dull.",
)


def versions() -> dict:
    import flax
    import tokenizers

    return {
        "transformers": transformers.__version__,
        "flax": flax.__version__,
        "jax": jax.__version__,
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "tokenizers": tokenizers.__version__,
        "matmul_precision": "highest",
    }


def torch_layout(config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every parameter of a BertModel / RobertaModel under its PyTorch name, drawn at random."""
    d, f = config.hidden_size, config.intermediate_size

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.3, shape).astype(np.float32)

    def ln(prefix: str) -> dict:
        return {
            f"{prefix}.LayerNorm.weight": (1.0 + w(d)).astype(np.float32),
            f"{prefix}.LayerNorm.bias": w(d),
        }

    t = {
        "embeddings.word_embeddings.weight": w(config.vocab_size, d),
        "embeddings.position_embeddings.weight": w(config.max_position_embeddings, d),
        "embeddings.token_type_embeddings.weight": w(config.type_vocab_size, d),
        **ln("embeddings"),
        "pooler.dense.weight": w(d, d),
        "pooler.dense.bias": w(d),
    }
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            t[f"{p}.attention.self.{name}.weight"] = w(d, d)  # [out, in]
            t[f"{p}.attention.self.{name}.bias"] = w(d)
        t[f"{p}.attention.output.dense.weight"] = w(d, d)
        t[f"{p}.attention.output.dense.bias"] = w(d)
        t.update(ln(f"{p}.attention.output"))
        t[f"{p}.intermediate.dense.weight"] = w(f, d)
        t[f"{p}.intermediate.dense.bias"] = w(f)
        t[f"{p}.output.dense.weight"] = w(d, f)
        t[f"{p}.output.dense.bias"] = w(d)
        t.update(ln(f"{p}.output"))
    return t


def check_all_loaded(model, tensors: dict[str, np.ndarray]) -> None:
    """Every Flax parameter equals a tensor we wrote (up to a transpose): none was left at its
    random init because a name did not match."""
    sums = sorted(float(x.astype(np.float64).sum()) for x in tensors.values())
    leaves = jax.tree_util.tree_leaves_with_path(model.params)
    if len(leaves) != len(tensors):
        sys.exit(f"reference has {len(leaves)} params, we wrote {len(tensors)}")
    for path, leaf in leaves:
        s = float(np.asarray(leaf, np.float64).sum())
        if not any(abs(s - x) <= 1e-6 * max(1.0, abs(x)) for x in sums):
            sys.exit(f"reference param {jax.tree_util.keystr(path)} is not one we wrote")


def tiny(name: str, out: str) -> None:
    rng = np.random.default_rng(0)
    common = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    if name == "bert":
        config = transformers.BertConfig(
            **common, max_position_embeddings=40, type_vocab_size=2, layer_norm_eps=1e-12
        )
        config.architectures = ["BertModel"]
        model_cls = transformers.FlaxBertModel
    else:
        config = transformers.RobertaConfig(
            **common, max_position_embeddings=42, type_vocab_size=1, layer_norm_eps=1e-5,
            pad_token_id=1, bos_token_id=0, eos_token_id=2,
        )  # fmt: skip
        config.architectures = ["RobertaModel"]
        model_cls = transformers.FlaxRobertaModel
    directory = os.path.join(out, f"tiny_{name}")
    os.makedirs(directory, exist_ok=True)
    config.to_json_file(os.path.join(directory, "config.json"))
    tensors = torch_layout(config, rng)
    buffers = {"embeddings.position_ids": np.arange(config.max_position_embeddings)[None]}
    path = os.path.join(directory, "model.safetensors")
    save_file({**tensors, **buffers}, path, {"format": "pt"})
    model = model_cls.from_pretrained(directory)
    check_all_loaded(model, tensors)

    pad = config.pad_token_id
    lengths = (12, 7, 1)
    length = max(lengths) + 2  # every row padded, the longest too
    ids = np.full((len(lengths), length), pad, np.int32)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(3, config.vocab_size, n)
        mask[row, :n] = 1
        if config.type_vocab_size > 1:
            types[row, n // 2 : n] = 1  # a second segment
    hidden = model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    np.savez(
        os.path.join(out, f"tiny_{name}_golden.npz"),
        ids=ids,
        mask=mask,
        types=types,
        hidden=np.asarray(hidden, np.float32),
    )
    print(f"{directory}: {sum(x.size for x in tensors.values())} parameters; golden {ids.shape}")


def real(model_dir: str, out: str) -> str:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()  # the shipped file pads every batch to 128
    tok.enable_truncation(128)
    encs = tok.encode_batch(list(SENTENCES))
    length = max(len(e.ids) for e in encs) + 2  # every row padded
    ids = np.zeros((len(encs), length), np.int32)
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    for row, e in enumerate(encs):
        ids[row, : len(e.ids)] = e.ids
        mask[row, : len(e.ids)] = e.attention_mask
        types[row, : len(e.ids)] = e.type_ids
    model = transformers.FlaxBertModel.from_pretrained(model_dir)
    hidden = np.asarray(model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state)
    name = os.path.basename(os.path.normpath(model_dir))
    path = os.path.join(out, f"{name}_reference.npz")
    np.savez(
        path,
        ids=ids,
        mask=mask,
        types=types,
        hidden=hidden.astype(np.float32),
        sentences=np.array(SENTENCES),
    )
    print(f"{path}: {ids.shape}, largest |hidden| {np.abs(hidden).max():.2f}")
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", choices=("tiny",), help="the tiny random checkpoints")
    ap.add_argument("--model", default="", help="a real BERT model directory")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    if not args.what and not args.model:
        ap.error("say `tiny` or --model DIR")
    os.makedirs(args.out, exist_ok=True)
    record_path = os.path.join(args.out, "versions.json")
    record = {}
    if os.path.exists(record_path):
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
    if args.what == "tiny":
        for name in ("bert", "roberta"):
            tiny(name, args.out)
        record["tiny"] = versions()
    if args.model:
        record[real(args.model, args.out)] = versions()
    with open(record_path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
