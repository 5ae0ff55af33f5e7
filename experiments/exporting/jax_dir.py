"""attn's own classifier (trained from scratch or distilled) written as a directory that jax
serves without this repository (`write`). No transformers class computes this model, so its
forward is exported with `jax.export`: StableHLO, serialized, with the batch and the length
symbolic.

    model.jax         jax.export.Exported of probabilities(weights, tokens [b, l] int32, and
                      bag_tokens [b, g] where the bag reads more of a text) -> [b, C] float32,
                      l at most max_len where the positions are learned
    weights.npz       the served weights (the weight average where the run kept one), each under
                      its path in the tree ("embed/tokens")
    vocab.txt, tokenizer.json   the run's tokenizer, as the workdir has them
    classifier.json   the labels, and how a text is read: tokenizer, lowercase, max_len, tail_len,
                      CLS, bag_len, buckets, batch size
    load.py           the loader (`jax_loader`): a text to ids as training made them, batches
                      padded as predict pads them, the exported forward; jax and numpy alone
                      (and flatbuffers, which jax.export's serialization reads)
    README.md         what it is and how to use it

The directory is written beside `out` under a temporary name and renamed into place when whole.
"""

import dataclasses
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

from attn import classifier
from experiments.errors import UserError
from experiments.exporting import hub_dir
from experiments.training import workdir_reader

MODEL, WEIGHTS, SPEC, LOADER = "model.jax", "weights.npz", "classifier.json", "load.py"
_LOADER_SOURCE = pathlib.Path(__file__).with_name("jax_loader.py")
FORMAT = 1


def _flat(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def forward(cfg: classifier.ModelConfig, bag_tokens: bool):
    """probabilities(params, tokens_BxL[, bag_BxG]) -> [B, C]: the served model, no dropout."""

    def probabilities(params, tokens_BxL, bag_BxG=None):
        logits_BxC, _ = classifier.apply(params, tokens_BxL, cfg, bag_tokens_BxG=bag_BxG)
        return jax.nn.softmax(logits_BxC)

    return probabilities if bag_tokens else lambda params, t: probabilities(params, t)


def exported(params: dict, cfg: classifier.ModelConfig, bag_len: int) -> bytes:
    """The serialized `forward`, for any batch and length (the length at most max_len where the
    positions are learned)."""
    limit = (f"l <= {cfg.max_len}",) if cfg.positions == "learned" else ()
    b, length, g = export.symbolic_shape("b, l, g", constraints=limit)
    specs = [
        jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params),
        jax.ShapeDtypeStruct((b, length), jnp.int32),
    ]
    if bag_len:
        specs.append(jax.ShapeDtypeStruct((b, g), jnp.int32))
    fn = jax.jit(forward(cfg, bool(bag_len)))
    return export.export(fn)(*specs).serialize()


@dataclasses.dataclass(frozen=True)
class Spec:
    """classifier.json: what the loader needs beside the weights and the tokenizer files."""

    label_names: list[str]
    tokenizer: str
    lowercase: bool
    max_len: int
    tail_len: int
    add_cls: bool
    bag_len: int
    buckets: list[int]
    batch_size: int
    format: int = FORMAT


def write(held: workdir_reader.Workdir, out: pathlib.Path, card: str) -> pathlib.Path:
    """Writes the workdir's served model at `out` (refused when it holds files) whole or not at
    all; returns it. `card`: README.md's text."""
    hub_dir.check_out(out)
    d, cfg = held.config.data, held.cfg
    tok = held.tokenizer
    if tok.kind not in ("char", "word", "byte"):
        raise UserError(f"{held.workdir!r}: a tokenizer of kind {tok.kind!r} cannot be exported")
    params = held.weights()
    spec = Spec(
        label_names=list(held.label_names),
        tokenizer=tok.kind,
        lowercase=bool(tok.lowercase),
        max_len=int(cfg.max_len),
        tail_len=int(d.tail_len),
        add_cls=cfg.pooling == "cls",
        bag_len=int(d.bag_len),
        buckets=[int(b) for b in d.buckets],
        batch_size=int(d.eval_batch_size),
    )
    with hub_dir.put_in_place(out) as tmp:
        (tmp / MODEL).write_bytes(exported(params, cfg, spec.bag_len))
        np.savez(tmp / WEIGHTS, **_flat(jax.device_get(params)))
        tok.save(tmp)
        (tmp / SPEC).write_text(json.dumps(dataclasses.asdict(spec), indent=1) + "\n", "utf-8")
        shutil.copyfile(_LOADER_SOURCE, tmp / LOADER)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return out


def model_card(held: workdir_reader.Workdir, test: dict | None, where: str) -> str:
    """README.md: what the model is, its labels and test accuracy, how to load it."""
    cfg = held.cfg
    labels = ", ".join(f"{i}: {n}" for i, n in enumerate(held.label_names))
    accuracy = (
        f"{100 * test['accuracy']:.2f}% test accuracy on {test['num_examples']:,} held-out texts "
        f"(the run's eval_test.json, step {test['step']})."
        if test
        else "Test accuracy not measured: the run wrote no eval_test.json (it did not finish)."
    )
    return "\n".join(
        [
            "# An attn self-attention sentence classifier, exported with jax.export",
            "",
            f"attn's own model ({held.describe()}): {cfg.num_layers} layer(s) of "
            f"{cfg.num_heads}-head self-attention, width {cfg.d_model}, "
            f"{held.tokenizer.kind} tokens, {cfg.pooling} pooling. Labels: {labels}. {accuracy}",
            "",
            "`model.jax` is its forward as serialized StableHLO (batch and length symbolic) over "
            "`weights.npz`; `load.py` reads texts as training did. It needs jax and numpy (and "
            "flatbuffers, which jax.export reads), not the project that trained it:",
            "",
            "```python",
            "import sys",
            "",
            f"sys.path.insert(0, {where!r})",
            "import load",
            "",
            f"model = load.Classifier({where!r})",
            'print(model.predict(["a text to classify"]))  # [(label, probability)]',
            "```",
            "",
            f"or `python {where}/load.py TEXT ...`.",
            "",
        ]
    )
