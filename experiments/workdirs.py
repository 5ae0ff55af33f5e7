"""A training workdir: the checks before writing into one, its config.json read back, atomic JSON
files. Reading a trained one back is `training.workdir_reader`'s.

A workdir holds config.json, tokenizer.json and vocab.txt, checkpoints/ and best/ (see
`checkpoints`), metrics.jsonl and tensorboard/, eval_test.json, baseline.json and scripts.json
(training's; scripts.json: which scripts its training texts are written in), evaluate_*.json
(evaluate's), curves.png and visualize/.
"""

import json
import os
import shutil

import jax
import ml_collections

from experiments import fields
from experiments.errors import UserError

MIN_FREE_BYTES = 64 << 20
# tokenizer.json field -> the config field it was built from
_TOKENIZER_FIELDS = {
    "kind": "data.tokenizer",
    "lowercase": "data.lowercase",
    "min_freq": "data.min_freq",
    "max_vocab": "data.max_vocab",
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
    checkpoint's to check). Fields whose row in `fields.FIELDS` says so may differ."""
    saved = {}
    config_path = os.path.join(workdir, "config.json")
    if os.path.exists(config_path):
        saved.update(fields.flat(read_config(config_path).to_dict()))
    tokenizer_path = os.path.join(workdir, "tokenizer.json")
    if os.path.exists(tokenizer_path):  # what the saved vocabulary was really built with
        tok = read_json(tokenizer_path)
        saved.update({field: tok[k] for k, field in _TOKENIZER_FIELDS.items() if k in tok})
    current = fields.flat(json.loads(json.dumps(config.to_dict())))  # tuples as JSON has them
    diff = [
        f"{k}: workdir {v!r} vs config {current.get(k)!r}"
        for k, v in sorted(saved.items())
        if fields.compared_on_resume(k) and current.get(k) != v
    ]
    if diff:
        raise UserError(
            f"workdir {workdir!r} holds a run with another config ({'; '.join(diff)}); "
            "use a new --workdir or the original config"
        )


def read_config(path: str) -> ml_collections.ConfigDict:
    """A workdir's config.json, with the fields it predates set as its run used them."""
    return ml_collections.ConfigDict(fields.complete(read_json(path)))


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} is not a JSON object")
    return obj


def write_json(path: str, obj: object) -> None:
    """Writes `obj` to `path` whole or not at all (a temporary file, then a rename)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)
