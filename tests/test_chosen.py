"""Settings chosen from the data (configs/csv.py): the rules, overrides kept, what a run records."""

import csv
import json

import pytest
from conftest import run_here

from configs import csv as csv_config
from configs import default
from experiments.data import chosen, datasets

_EN = "the film was {} and the plot {} so i would {} it to a friend who likes quiet dramas"
_ZH = "这本书的内容{}，读起来{}，推荐给{}的朋友"


_EN_WORDS = [("great", "moved me", "recommend"), ("dull", "dragged", "never show")]
_ZH_WORDS = [("很精彩", "很流畅", "喜欢读书"), ("很无聊", "很费劲", "没有耐心")]


def _write(path, n: int, template: str, words=_EN_WORDS) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(n):
            label = i % 2
            w.writerow([template.format(*words[label]) + f" {i}", "pos" if label == 0 else "neg"])
    return str(path)


def _config(path: str, **overrides):
    config = csv_config.get_config()
    with config.unlocked():
        config.data.path = path
        for key, value in overrides.items():
            section, field = key.split("__")
            config[section][field] = value
    return config


def test_english_gets_words_and_its_length(tmp_path, capsys):
    config = chosen.resolve(_config(_write(tmp_path / "en.csv", 200, _EN)))
    d, t, o = config.data, config.train, config.optim
    assert d.tokenizer == "word"
    assert d.max_len == 32 and d.buckets == (8, 16, 24, 32)  # 19-20 words per text
    assert d.tail_len == 24  # a longer text keeps its first 8 and last 24 words
    n_train = 200 * 0.8  # about: the hash split
    assert t.num_epochs == 10  # 40,000 examples would be 250 epochs: capped
    steps = t.num_epochs * -(-int(n_train) // d.batch_size)
    assert abs(o.warmup_steps - 0.075 * steps) <= 2
    assert t.checkpoint_every_steps == 2 * t.eval_every_steps and t.eval_every_steps >= 1
    err = capsys.readouterr().err
    assert "chosen from the data: tokenizer=word" in err and "max_len=32" in err


def test_chinese_gets_characters(tmp_path):
    config = chosen.resolve(_config(_write(tmp_path / "zh.csv", 100, _ZH, _ZH_WORDS)))
    assert config.data.tokenizer == "char" and config.data.max_len == 32  # 26-29 characters


def test_what_the_user_sets_is_kept(tmp_path):
    path = _write(tmp_path / "en.csv", 200, _EN)
    config = chosen.resolve(
        _config(
            path, data__tokenizer="char", data__max_len=100, data__tail_len=0, train__num_epochs=3
        )
    )
    d = config.data
    assert (d.tokenizer, d.max_len, d.tail_len, config.train.num_epochs) == ("char", 100, 0, 3)
    assert config.data.buckets == default.get_config().data.buckets  # set with max_len, kept
    # A config with nothing left to the data is returned as is, without reading it.
    plain = default.get_config()
    assert chosen.resolve(plain) is plain


def test_a_run_records_what_was_chosen(tmp_path, capsys):
    path = _write(tmp_path / "en.csv", 120, _EN)
    flags = ["--config=configs/csv.py", f"--config.data.path={path}"]
    flags += ["--config.train.max_steps=2", "--config.model.d_model=8", "--config.model.d_ff=8"]
    proc = run_here("experiments.train", *flags, f"--workdir={tmp_path / 'w'}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads((tmp_path / "w" / "config.json").read_text(encoding="utf-8"))
    assert recorded["data"]["tokenizer"] == "word" and recorded["data"]["max_len"] == 32
    assert recorded["data"]["tail_len"] == 24
    assert recorded["train"]["eval_every_steps"] == 1  # 2 steps / 13, at least 1
    assert recorded["optim"]["warmup_steps"] == 0


@pytest.mark.parametrize(
    "lengths, want",
    [
        ([10] * 99 + [32], 0),  # fits: the bag reads what attention reads
        ([10] * 98 + [33] * 2, 64),
        ([10] * 98 + [100] * 2, 128),
        ([10] * 98 + [10_000] * 2, 256),  # at most 8 max_len
    ],
)
def test_the_bag_reads_up_to_the_99th_percentile(lengths, want):
    assert chosen.bag_len(lengths, 32) == want


def test_the_bag_length_is_chosen_only_with_a_bag(tmp_path):
    long = "the film " * 25 + "{} {} {}"
    path = _write(tmp_path / "en.csv", 200, long)
    with_bag = chosen.resolve(_config(path, data__max_len=32))
    assert with_bag.data.bag_len == 64  # 55-57 words, max_len 32 set by hand
    without = chosen.resolve(_config(path, data__max_len=32, model__bag_buckets=0))
    assert without.data.bag_len == 0


@pytest.mark.parametrize(
    "texts, share",
    [(["abc def"], 0.0), (["这本书"], 1.0), (["好 ok"], 1 / 3), ([""], 0.0)],
)
def test_cjk_share(texts, share):
    assert chosen.cjk_share(texts) == pytest.approx(share)


@pytest.mark.parametrize(
    "steps, want", [(810, 0.99), (4210, 0.99), (800, 0.99), (124, 1 - 8 / 124), (10, 0.5)]
)
def test_the_weight_average_spans_about_the_last_eighth_of_a_short_run(steps, want):
    """0.99 as measured on an 810-step fine-tune (about its last 100 steps); a shorter run's
    average would otherwise reach back into its warmup."""
    assert chosen.ema_decay(steps) == pytest.approx(want)


def test_a_fine_tune_chooses_its_average_from_its_length(tmp_path, capsys):
    from configs import finetune

    config = finetune.get_config()
    with config.unlocked():
        config.data.path = _write(tmp_path / "en.csv", 400, _EN)
        config.model.pretrained = "unused"  # the choice reads the data, not the checkpoint
        config.data.tokenizer, config.data.max_len, config.data.tail_len = "word", 32, 24
        config.optim.learning_rate = 1e-4  # the width's rule would read the checkpoint
    out = chosen.resolve(config)
    n_train = len(datasets.load_splits(out.data, ("train",))["train"][0])
    steps = out.train.num_epochs * -(-n_train // out.data.batch_size)
    assert out.optim.ema_decay == pytest.approx(1 - 8 / steps) and steps < 800
    assert f"ema_decay={out.optim.ema_decay:.3g}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "d_model, want",
    [(32, 1e-4), (384, 1e-4), (512, 1e-4), (768, 2e-5), (1024, 1e-5), (2048, 1e-5)],
)
def test_the_learning_rate_follows_the_encoders_width(d_model, want):
    """MiniLM (384) and m3e-small (512) as chosen on validation; base and large as published."""
    assert chosen.learning_rate(d_model) == want


def test_a_fine_tune_chooses_its_learning_rate_from_its_checkpoint(tmp_path, capsys):
    from conftest import ROOT

    from configs import finetune

    config = finetune.get_config()
    with config.unlocked():
        config.data.path = _write(tmp_path / "en.csv", 40, _EN)
        config.model.pretrained = str(ROOT / "tests" / "data" / "bert" / "tiny_bert")
        config.data.max_len, config.data.tail_len = 32, 24
    assert config.optim.learning_rate == -1
    out = chosen.resolve(config)
    assert out.optim.learning_rate == 1e-4
    assert "learning_rate=0.0001 (d_model 32)" in capsys.readouterr().err


def test_a_learning_rate_from_the_width_needs_a_pretrained_encoder(tmp_path):
    from experiments.errors import UserError

    config = _config(_write(tmp_path / "en.csv", 40, _EN), optim__learning_rate=-1)
    with pytest.raises(UserError, match="optim.learning_rate=-1 is chosen from a pretrained"):
        chosen.resolve(config)
