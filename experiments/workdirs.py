"""A training workdir: the checks before writing into one, its config.json read back, atomic JSON
files. Loading a trained one to serve is `serving`'s.

A workdir holds config.json, tokenizer.json and vocab.txt, checkpoints/ and best/ (see
`checkpoints`), metrics.jsonl and tensorboard/, eval_test.json and baseline.json (training's),
evaluate_*.json (evaluate's), curves.png and visualize/.
"""

import json
import os
import shutil

import jax
import ml_collections

from experiments.errors import UserError

MIN_FREE_BYTES = 64 << 20
# What a resumed run may change: where the data is, how long to train, how often to evaluate,
# save and log. Every other field decides what is trained (the model's are checked against the
# checkpoint, `checkpoints.resume`), so a run continued with another value would be another run.
MAY_CHANGE_ON_RESUME = frozenset(
    {
        "data.data_dir",
        "data.eval_batch_size",
        "data.max_bad_fraction",
        "optim.max_nonfinite",
        "train.num_epochs",
        "train.max_steps",
        "train.eval_every_steps",
        "train.checkpoint_every_steps",
        "train.log_every_steps",
        "train.keep_checkpoints",
        "train.baseline",
    }
)
# config.model fields that are not the model's (`optimization.RUN_FIELDS`), so no checkpoint's model
# config holds them: checked here with the rest of config.json.
_NOT_IN_CHECKPOINT = frozenset({"model.init_from", "model.embeddings_from"})
# tokenizer.json field -> the config field it was built from
_TOKENIZER_FIELDS = {
    "kind": "data.tokenizer",
    "lowercase": "data.lowercase",
    "min_freq": "data.min_freq",
    "max_vocab": "data.max_vocab",
}
# Fields added after workdirs were first written -> the value runs from before them used: a saved
# config.json without one is read with it, so resuming such a run with a config that sets another
# value is refused like any other change.
_ADDED_LATER = {
    "data.label_names": [],
    "data.tail_len": 0,
    "data.bag_len": 0,
    "optim.bag_init": "zeros",
    "optim.adversarial_relative": False,
    "model.init_from": "",
    "model.embeddings_from": "",
    "train.patience": 0,
    "optim.warm_lr_scale": 1.0,
}


def check_writable(workdir: str) -> None:
    """Fails before any work when the workdir cannot hold checkpoints."""
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write_test{jax.process_index()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"workdir {workdir!r} is not writable: {e.strerror}") from None
    free = shutil.disk_usage(workdir).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"workdir {workdir!r} has only {free >> 20} MiB free; need 64 MiB")


def remove_if_unused(workdir: str) -> None:
    """Deletes `workdir` when it holds no file (folders only): what a run refused before writing
    anything leaves behind. Call it only for a workdir that run created."""
    if os.path.isdir(workdir) and not any(files for _, _, files in os.walk(workdir)):
        shutil.rmtree(workdir)


def check_same_run(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Refuses to continue the run in `workdir` with other data, tokenizer, optimizer or seed than
    its config.json and tokenizer.json record, naming every differing field (model fields are the
    checkpoint's to check). Fields in MAY_CHANGE_ON_RESUME may differ."""
    saved = {}
    config_path = os.path.join(workdir, "config.json")
    if os.path.exists(config_path):
        saved.update(_flat(read_config(config_path).to_dict()))
    tokenizer_path = os.path.join(workdir, "tokenizer.json")
    if os.path.exists(tokenizer_path):  # what the saved vocabulary was really built with
        tok = read_json(tokenizer_path)
        saved.update({field: tok[k] for k, field in _TOKENIZER_FIELDS.items() if k in tok})
    current = _flat(json.loads(json.dumps(config.to_dict())))  # tuples as JSON has them
    diff = [
        f"{k}: workdir {v!r} vs config {current.get(k)!r}"
        for k, v in sorted(saved.items())
        if (not k.startswith("model.") or k in _NOT_IN_CHECKPOINT)
        and k not in MAY_CHANGE_ON_RESUME
        and current.get(k) != v
    ]
    if diff:
        raise UserError(
            f"workdir {workdir!r} holds a run with another config ({'; '.join(diff)}); "
            "use a new --workdir or the original config"
        )


def read_config(path: str) -> ml_collections.ConfigDict:
    """A workdir's config.json, with the fields it predates set as its run used them."""
    return ml_collections.ConfigDict(complete(read_json(path)))


def complete(saved: dict) -> dict:
    """A config saved as JSON, with the fields it predates set as its run used them."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for name, old in _ADDED_LATER.items():
        section, field = name.split(".")
        if section in out:
            out[section].setdefault(field, old)
    return out


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} is not a JSON object")
    return obj


def _flat(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_json(path: str, obj: object) -> None:
    """Writes `obj` to `path` whole or not at all (a temporary file, then a rename)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)
