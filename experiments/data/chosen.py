"""Settings a config leaves to the data: the tokenizer, the length, the schedule.

`configs/csv.py` marks them `auto` (the tokenizer) or 0 (max_len, num_epochs, eval and checkpoint
intervals; warmup_steps and tail_len -1), because a user's data may be Chinese sentences or
English essays.
`resolve` fills them from the training split and returns a new config, which the run then records
in `config.json`; a field set to anything else is kept as given. The rules:

- tokenizer: `char` when more than 30% of the non-space characters are CJK, else `word`.
- max_len: the 95th percentile of the training texts' lengths in those tokens (a checkpoint's
  own, [CLS] and [SEP] included, for data.tokenizer=pretrained), rounded up to a
  multiple of 32 and kept in [32, 512], or [32, 256] when a bag whose length is also left to the
  data reads the rest of a longer text (attention costs a row of L scores per token, the bag a
  lookup); buckets at 1/4, 1/2, 3/4 and all of it.
- tail_len: 3/4 of max_len, so a longer text keeps its first quarter and its end, where a review
  often gives its verdict.
- bag_len (with a bag): the 99th percentile of the lengths, rounded up to max_len times a power of
  two, at most 8 max_len; 0 (the attention's tokens) when that is max_len. The bag reads a token
  for a few operations, attention for a row of the L x L scores, so it can read far more.
- num_epochs: about 40,000 examples seen (3 epochs of the embedded data's 13,875), 2 to 10 epochs;
  fine-tuning a pretrained encoder (model.pretrained): about 30,000, 2 to 4 epochs. An epoch of a
  run with distill.augment copies of each text is one over them too (1 + augment texts each).
- warmup_steps: 7.5% of the steps; eval_every_steps: 1/13 of them; checkpoints twice as far apart.
- ema_decay: 0.99 (an average over about the last 100 steps, as measured on an 810-step
  fine-tune), or for a run under 800 steps 1 - 8/steps, so that the average spans about its last
  eighth and does not reach back into the warmup.
- learning_rate (fine-tuning a pretrained encoder): by the encoder's width, `learning_rate`.
"""

import math
import re
import sys

import ml_collections
import numpy as np

from attn import encoders
from experiments import fields
from experiments.data import batching, checkpoint_tokenizer, datasets, tokenizers
from experiments.errors import UserError

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_SAMPLE = 5000  # texts looked at for the script and the lengths: enough for a 95th percentile


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with every data-chosen field filled from the train split (printed on stderr)."""
    config, said = choose(config)
    if said:
        print(said, file=sys.stderr)
    return config


def choose(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, str]:
    """`resolve`'s config, and its line for the user ("" when the config leaves nothing to the
    data), for a caller that prints it only once its other checks have passed."""
    auto = fields.left_to_data(config)
    if not auto:
        return config, ""
    out = ml_collections.ConfigDict(config.to_dict())
    d = out.data
    said = []
    if "optim.learning_rate" in auto:  # the checkpoint's, not the data's: read no texts for it
        width = _encoder_width(out)
        out.optim.learning_rate = learning_rate(width)
        said.append(f"learning_rate={out.optim.learning_rate:g} (d_model {width})")
    if auto <= {"optim.learning_rate"}:
        out.lock()
        return out, f"chosen: {', '.join(said)}"
    texts = datasets.load_splits(config.data, ("train",))["train"][0]
    sample = texts[:: max(1, len(texts) // _SAMPLE)]
    if "data.tokenizer" in auto:
        share = cjk_share(sample)
        d.tokenizer = "char" if share > 0.3 else "word"
        said.append(f"tokenizer={d.tokenizer} ({share:.0%} of characters CJK)")
    if auto & {"data.max_len", "data.bag_len"}:
        lengths = _lengths(out, sample)
    if "data.max_len" in auto:
        p95 = float(np.percentile(lengths, 95))
        # Attention pays a row of L scores per token; with a bag to read the rest, it reads less.
        cap = 256 if out.model.bag_buckets and "data.bag_len" in auto else 512
        d.max_len = int(min(max(32 * math.ceil(p95 / 32), 32), cap))
        d.buckets = tuple(sorted({max(8, d.max_len * i // 4) for i in (1, 2, 3, 4)}))
        capped = f"; attention reads at most {cap}, the bag more" if p95 > cap else ""
        said.append(f"max_len={d.max_len} (95% of texts have <= {p95:.0f} tokens{capped})")
    if "data.tail_len" in auto:
        d.tail_len = 3 * d.max_len // 4
        said.append(f"tail_len={d.tail_len}")
    if "data.bag_len" in auto:
        d.bag_len = bag_len(lengths, d.max_len) if out.model.bag_buckets else 0
        said.append(f"bag_len={d.bag_len}")
    copies = 1 + (out.distill.augment if "distill" in out else 0)
    examples = len(texts) * copies  # an epoch's, the augmented copies included
    counted = f"{len(texts):,} training texts" + (f" x {copies}" if copies > 1 else "")
    if "train.num_epochs" in auto and out.model.get("pretrained"):
        out.train.num_epochs = int(min(max(round(30_000 / max(examples, 1)), 2), 4))
        said.append(f"num_epochs={out.train.num_epochs} ({counted})")
    elif "train.num_epochs" in auto:
        out.train.num_epochs = int(min(max(round(40_000 / max(examples, 1)), 2), 10))
        said.append(f"num_epochs={out.train.num_epochs} ({counted})")
    if auto & {
        "optim.warmup_steps",
        "optim.ema_decay",
        "train.eval_every_steps",
        "train.checkpoint_every_steps",
    }:
        t = out.train
        total = t.max_steps or t.num_epochs * batching.steps_per_epoch(examples, d.batch_size)
        if "optim.warmup_steps" in auto:
            out.optim.warmup_steps = round(0.075 * total)
            said.append(f"warmup_steps={out.optim.warmup_steps}")
        if "optim.ema_decay" in auto:
            out.optim.ema_decay = ema_decay(total)
            said.append(f"ema_decay={out.optim.ema_decay:.3g}")
        if "train.eval_every_steps" in auto:
            t.eval_every_steps = max(total // 13, 1)
            said.append(f"eval_every_steps={t.eval_every_steps}")
        if "train.checkpoint_every_steps" in auto:
            t.checkpoint_every_steps = 2 * t.eval_every_steps
            said.append(f"checkpoint_every_steps={t.checkpoint_every_steps}")
    out.lock()
    return out, f"chosen from the data: {', '.join(said)}"


# Peak fine-tuning learning rate by the encoder's width (d_model) up to which it holds. Up to 512,
# chosen on validation among 5e-5, 1e-4 and 2e-4 for all-MiniLM-L6-v2 (384) on English review
# sentences and m3e-small (512) on the embedded Chinese reviews (`python -m benchmarks finetune`,
# `chinese`); base encoders (768): 2e-5, the rate the BERT paper's search (5e-5 to 2e-5) and
# transformers' examples use for BERT-base; large ones (1024 and wider): 1e-5, RoBERTa-large's.
LEARNING_RATES = ((512, 1e-4), (768, 2e-5))
LARGE_RATE = 1e-5


def learning_rate(d_model: int) -> float:
    """The fine-tuning learning rate for an encoder of width `d_model` (LEARNING_RATES)."""
    return next((lr for width, lr in LEARNING_RATES if d_model <= width), LARGE_RATE)


def _encoder_width(config: ml_collections.ConfigDict) -> int:
    """model.pretrained's d_model, from its config.json and weight headers."""
    if not config.model.get("pretrained"):
        raise UserError(
            "optim.learning_rate=-1 is chosen from a pretrained encoder's width: set "
            "model.pretrained, or give attn's own model a rate"
        )
    try:
        return encoders.open_checkpoint(config.model.pretrained).config.d_model
    except encoders.CheckpointError as e:
        raise UserError(f"model.pretrained: {e}") from None


def ema_decay(total_steps: int) -> float:
    """The weight average's decay for a run of total_steps: about its last eighth, at most 0.99."""
    return min(0.99, max(0.5, 1 - 8 / max(total_steps, 1)))


def _lengths(config: ml_collections.ConfigDict, sample: list[str]) -> list[int]:
    """Each text's length in the tokens config.data.tokenizer makes, a checkpoint's [CLS] and
    [SEP] included."""
    d = config.data
    if d.tokenizer == "pretrained":
        tok = checkpoint_tokenizer.for_config(config)
        framing = sum(len(part) for part in tok.frame)
        return [len(tok.encode(s)) + framing for s in sample]
    split = list if d.tokenizer == "char" else tokenizers.split_words
    return [len(split(s.strip())) for s in sample]


def bag_len(lengths: list[int], max_len: int) -> int:
    """The bag_len rule above, for texts of `lengths` tokens."""
    p99, m = float(np.percentile(lengths, 99)), max_len
    while m < p99 and m < 8 * max_len:
        m *= 2
    return m if m > max_len else 0


def cjk_share(texts: list[str]) -> float:
    """Fraction of the non-space characters of `texts` that are CJK ideographs, kana or hangul."""
    chars = sum(len(s) - s.count(" ") for s in texts)
    return sum(len(_CJK.findall(s)) for s in texts) / max(chars, 1)
