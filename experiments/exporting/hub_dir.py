"""A fine-tuned classifier written as a transformers model directory: what
AutoModelForSequenceClassification.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR)
load, and `attn.encoder_classifier.load` reads back.

    config.json              the pretrained checkpoint's, updated: the encoder attn computed
                             (Family.to_hf), the class (architectures; auto_map for a mean-pooled
                             classifier), its head's keys, id2label / label2id, problem_type
    model.safetensors        the served weights alone (float32), by the class's names
    modeling_mean_pooled.py  the mean-pooled class (`mean_pooled`), when the family has none
    tokenizer files          the checkpoint's own, as the run read them: no fixed padding or
                             truncation built in, model_max_length the encoder's
    README.md                a model card: what it is, its labels, its test accuracy, how to load

The directory is written beside `out` under a temporary name and renamed into place when whole,
so a failed export leaves nothing at `out`.
"""

import contextlib
import dataclasses
import json
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator

import numpy as np

from attn import encoder_classifier, encoders
from attn.encoders import heads
from experiments.data import checkpoint_tokenizer
from experiments.errors import UserError

MODELING_FILE = "modeling_mean_pooled.py"
_MEAN_POOLED_SOURCE = pathlib.Path(__file__).with_name("mean_pooled.py")
# The two imports of mean_pooled.py the family's classes replace.
_IMPORTS = re.compile(
    r"^from transformers\.models\.\S+ import (\w+) as (BaseModel|PretrainedBase)$", re.M
)


@dataclasses.dataclass(frozen=True)
class Model:
    """What is exported: the served params, their config, the label names in class order."""

    params: dict
    cfg: encoder_classifier.Config
    label_names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """The checkpoint's tokenizer files as the run read them: their folder, and whether the run
    lowercased each text before them (data.lowercase)."""

    directory: pathlib.Path
    lowercase: bool


def check_out(out: pathlib.Path) -> None:
    """UserError in one line when `out` exists and is not an empty directory."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(
            f"--out {str(out)!r} exists and is not an empty directory: pass a new path (export "
            "never writes into a directory that holds files)"
        )


def config_json(model: Model, base: dict) -> dict:
    """The checkpoint's config.json `base`, updated to describe `model`'s class."""
    cfg = model.cfg
    fam = encoders.family(cfg.encoder)
    encoder = dataclasses.replace(fam.head.encoder(cfg.encoder, cfg.pooling), dtype="float32")
    hf = {**base, **fam.to_hf(encoder)}
    for key in ("torch_dtype", "dtype"):  # the weights are written in float32
        if key in hf:
            hf[key] = "float32"
    architecture = encoder_classifier.architecture(cfg)
    if architecture == heads.MEAN_POOLED:
        hf["classifier_dropout"] = cfg.dropout
        module = pathlib.Path(MODELING_FILE).stem
        hf["auto_map"] = {"AutoModelForSequenceClassification": f"{module}.{architecture}"}
    else:
        hf.update(fam.head.to_hf(cfg.encoder, cfg.pooling))
        hf.pop("auto_map", None)
    hf["architectures"] = [architecture]
    hf["id2label"] = {str(i): name for i, name in enumerate(model.label_names)}
    hf["label2id"] = {name: i for i, name in enumerate(model.label_names)}
    hf["problem_type"] = "single_label_classification"
    # transformers derives it from id2label; written for readers of the file, and other tools.
    hf["num_labels"] = len(model.label_names)
    return hf


def modeling_file(cfg: encoder_classifier.Config) -> str:
    """mean_pooled.py importing the family's own base model and pretrained class."""
    classes = encoders.family(cfg.encoder).head.classes(cfg.encoder)
    names = {"BaseModel": classes.base, "PretrainedBase": classes.pretrained}
    source = _MEAN_POOLED_SOURCE.read_text(encoding="utf-8")
    return _IMPORTS.sub(
        lambda m: f"from {classes.module} import {names[m.group(2)]} as {m.group(2)}", source
    )


def _tokenizer_files(tok: Tokenizer, cfg: encoder_classifier.Config, into: pathlib.Path) -> None:
    """Copies the tokenizer files; tokenizer.json loses its built-in padding and truncation (and
    lowercases first, as the run did); model_max_length is what the encoder reads."""
    names = [n for n in checkpoint_tokenizer.FILES if (tok.directory / n).is_file()]
    if tok.lowercase and "tokenizer.json" not in names:
        raise UserError(
            "the run lowercased its texts (data.lowercase=True) before a tokenizer without "
            "tokenizer.json, which transformers cannot be told to lowercase the same way; "
            "export needs a checkpoint tokenizer.json (or a run without data.lowercase)"
        )
    for name in names:
        shutil.copyfile(tok.directory / name, into / name)
    if "tokenizer.json" in names:
        path = into / "tokenizer.json"
        spec = json.loads(path.read_text(encoding="utf-8"))
        spec["padding"] = spec["truncation"] = None
        if tok.lowercase:
            inner = [spec["normalizer"]] if spec.get("normalizer") else []
            lower = [{"type": "Lowercase"}, *inner]
            spec["normalizer"] = {"type": "Sequence", "normalizers": lower}
        path.write_text(json.dumps(spec, ensure_ascii=False, indent=2), encoding="utf-8")
    path = into / "tokenizer_config.json"
    settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    settings["model_max_length"] = cfg.encoder.max_length
    path.write_text(json.dumps(settings, ensure_ascii=False, indent=2), encoding="utf-8")


def write(
    out: pathlib.Path,
    model: Model,
    base: dict,
    tok: Tokenizer,
    card: str,
    then: Callable[[pathlib.Path], object] | None = None,
) -> pathlib.Path:
    """Writes the directory at `out` (refused when it holds files) whole or not at all; returns
    it. `base`: the pretrained checkpoint's config.json; `card`: README.md's text; `then(dir)`
    adds to the written directory before it is put in place (e.g. `onnx_file.write`)."""
    check_out(out)
    try:
        tensors = encoder_classifier.checkpoint_tensors(model.params, model.cfg)
    except ValueError as e:
        raise UserError(f"cannot export: {e}") from None
    from safetensors.numpy import save_file

    with put_in_place(out) as tmp:
        save_file(
            {k: np.ascontiguousarray(v) for k, v in tensors.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},  # transformers reads safetensors files marked so
        )
        _tokenizer_files(tok, model.cfg, tmp)
        hf = config_json(model, base)
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
        if encoder_classifier.architecture(model.cfg) == heads.MEAN_POOLED:
            (tmp / MODELING_FILE).write_text(modeling_file(model.cfg), encoding="utf-8")
        (tmp / "README.md").write_text(card, encoding="utf-8")
        if then is not None:
            then(tmp)
    return out


@contextlib.contextmanager
def put_in_place(out: pathlib.Path) -> Iterator[pathlib.Path]:
    """A new directory beside `out` to write into; when the block ends, it becomes `out` (absent
    or empty: `check_out`) with plain permissions, or, when the block raises, it is removed: an
    export is there whole or not at all."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        plain_permissions(tmp)
        if out.exists():
            out.rmdir()  # empty: checked above
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def plain_permissions(directory: pathlib.Path) -> None:
    """What mkdir and open would have given under the user's umask: mkdtemp makes the directory
    private (0700) and safetensors writes its file 0600, which another user serving the export
    could not read."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@dataclasses.dataclass(frozen=True)
class Card:
    """What README.md says beyond the model: the base checkpoint's name and model_type, the run
    (which checkpoint, which weights), its test result (eval_test.json; None: not measured), how
    much of a long text training read (`tail_len` of its last tokens), where it is written."""

    base: str
    model_type: str
    trained: str
    test: dict | None
    tail_len: int
    where: str


def model_card(model: Model, card: Card) -> str:
    """README.md: what the model is (family, base checkpoint, pooling and class), its labels,
    its test accuracy and how to load it."""
    cfg = model.cfg
    architecture = encoder_classifier.architecture(cfg)
    mean = architecture == heads.MEAN_POOLED
    reads = "the mean of its last hidden states over the real tokens"
    reads = reads if cfg.pooling == "mean" else "its first token's last hidden state"
    through = "one linear layer" if mean else "the model type's own classification head"
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-classification",
        "---",
        "",
        f"# A {card.model_type} sentence classifier fine-tuned from {card.base}",
        "",
        f"Fine-tuned with attn ({card.trained}): a {card.model_type} encoder of "
        f"{cfg.encoder.num_layers} layers, width {cfg.encoder.d_model}, classifying {reads} "
        f"through {through}. Transformers class: `{architecture}`"
        + (f" (its code is `{MODELING_FILE}` here)." if mean else "."),
        "",
        "## Labels",
        "",
        "| id | label |",
        "| --- | --- |",
        *(f"| {i} | {name} |" for i, name in enumerate(model.label_names)),
        "",
        "## Test accuracy",
        "",
    ]
    test = card.test
    if test:
        lines.append(
            f"{100 * test['accuracy']:.2f}% on {test['num_examples']:,} held-out texts, macro-F1 "
            f"{100 * test['macro_f1']:.2f}% (the run's eval_test.json, step {test['step']})."
        )
    else:
        lines.append("Not measured: the run wrote no eval_test.json (it did not finish).")
    remote = ", trust_remote_code=True" if mean else ""
    head = cfg.max_len - card.tail_len
    cut = f"the first {head} and last {card.tail_len}" if card.tail_len else f"the first {head}"
    lines += [
        "",
        "## Load it",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({card.where!r})",
        f"model = AutoModelForSequenceClassification.from_pretrained({card.where!r}{remote})",
        'batch = tokenizer(["a moving, funny film"], return_tensors="pt", truncation=True, '
        "padding=True)",
        "with torch.no_grad():",
        "    probabilities = model.eval()(**batch).logits.softmax(-1)",
        "print(model.config.id2label[int(probabilities.argmax())])",
        "```",
        "",
        f"Training read {cut} tokens of a longer text ([CLS] and [SEP] included), where "
        f"truncation=True keeps the first {cfg.encoder.max_length}. attn serves this directory "
        f"as it is: `python -m experiments.predict --pretrained={card.where} TEXT`.",
        "",
    ]
    return "\n".join(lines)
