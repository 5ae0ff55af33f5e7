"""Prints what a config's data looks like: split sizes, label balance, lengths, vocabulary size.

  python -m experiments.data_info --config=configs/default.py [--config.data.tokenizer=word]

Lengths are percentiles (50/90/99/max) in characters and in tokens (before truncation to
data.max_len, which is also shown as the fraction of texts it cuts; a checkpoint's [CLS] and [SEP]
count, as they do in max_len). With data.tokenizer=pretrained the tokens are model.pretrained's.
"""

from typing import Any

import numpy as np
from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments.data import checkpoint_tokenizer, chosen, encoding
from experiments.errors import UserError

_PERCENTILES = (50, 90, 99, 100)


def _lengths(xs: list[int]) -> str:
    if not xs:
        return "-"
    p = np.percentile(np.asarray(xs), _PERCENTILES, method="lower").astype(int)
    return "/".join(str(v) for v in p)


def describe(config: Any) -> str:
    """The report for `config`'s data, as printed by the CLI."""
    data_cfg = config.data
    # A checkpoint's tokenizer is read from model.pretrained, outside config.data.
    pretrained = data_cfg.tokenizer == checkpoint_tokenizer.KIND
    tok = checkpoint_tokenizer.for_config(config) if pretrained else None
    data = encoding.load(data_cfg, add_cls=False, tokenizer=tok)
    tok, names = data.tokenizer, data.label_names
    frame = tok.specials.frame
    framing = sum(len(part) for part in frame) if frame else 0
    unk_id = tok.specials.unk
    lines = [
        f"dataset {data_cfg.dataset}  labels {list(names)}  tokenizer {tok.kind}  "
        f"vocab_size {tok.vocab_size}  max_len {data_cfg.max_len}",
        f"{'split':<11}{'examples':>9}  {'label counts':<24}{'chars 50/90/99/max':<22}"
        f"{'tokens 50/90/99/max':<22}{'>max_len':>8}  {'unk':>6}",
    ]
    for split, s in data.splits.items():
        texts, labels = s.texts, s.labels
        counts = np.bincount(labels, minlength=len(names)) if len(labels) else np.zeros(len(names))
        balance = " ".join(f"{int(c)}({c / max(len(labels), 1):.0%})" for c in counts)
        ids = [tok.encode(t) for t in texts]  # before truncation to max_len
        n_tok = [len(i) + framing for i in ids]
        total = max(sum(len(i) for i in ids), 1)
        unk = sum(int((i == unk_id).sum()) for i in ids) / total
        cut = np.mean([n > data_cfg.max_len for n in n_tok]) if n_tok else 0.0
        lines.append(
            f"{split:<11}{len(texts):>9}  {balance:<24}{_lengths([len(t) for t in texts]):<22}"
            f"{_lengths(n_tok):<22}{cut:>8.1%}  {unk:>6.2%}"
        )
    return "\n".join(lines)


def define_flags(fv: flags.FlagValues) -> None:
    config_flags.DEFINE_config_file(
        "config", None, "Path to a config file[:variant].", flag_values=fv
    )


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    if fv.config is None:
        raise UserError("--config is required, e.g. --config=configs/default.py")
    print(describe(chosen.resolve(fv.config)))


if __name__ == "__main__":
    cli.main(define_flags, main)
