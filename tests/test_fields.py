"""The config table: every field of every config has a row, its checks name what they want, and a
new field is one row and one config line: its meaning, check, data-chosen default and resume rule
then reach --print_config, the checks, `data.chosen`, the resume check and older workdirs."""

import importlib
import json
import os
import re

import pytest
from test_configs import VARIANTS

from configs import default
from experiments import fields, workdirs
from experiments.errors import UserError


def _configs():
    for name, args in VARIANTS.items():
        for arg in args:
            yield name, arg, importlib.import_module(f"configs.{name}").get_config(arg)


def test_every_field_of_every_config_has_a_row_and_no_row_is_stale():
    seen = set()
    for name, arg, config in _configs():
        given = set(fields.flat(config.to_dict()))
        assert given <= set(fields.FIELDS), (name, arg, given - set(fields.FIELDS))
        seen |= given
    assert seen == set(fields.FIELDS)


def test_every_config_passes_its_checks():
    for _, _, config in _configs():
        fields.check(config)


def test_an_unknown_or_missing_field_is_refused_by_name():
    config = default.get_config()
    with config.unlocked():
        config.train.pateince = 3
    with pytest.raises(UserError, match=r"unknown config field\(s\) train\.pateince: "):
        fields.check(config)
    config = default.get_config()
    with config.unlocked():
        del config.optim["ema_decay"]
    with pytest.raises(UserError, match=r"lacks field\(s\) optim\.ema_decay;"):
        fields.check(config)


@pytest.mark.parametrize(
    "name, value, fragment",
    [
        ("optim.learning_rate", 0.0, "> 0 (or -1: from the encoder's width)"),
        ("optim.warmup_steps", -2, "an integer >= 0 (or -1: from the data)"),
        ("optim.label_smoothing", 1.0, "in [0, 1)"),
        ("optim.ema_decay", 1.0, "in [0, 1) (0 = no running average; -1: from the data)"),
        ("optim.max_nonfinite", True, "an integer >= 1"),
        ("optim.clip_norm", 0.0, "> 0"),
        ("optim.bag_init", "nb", "one of ('zeros', 'naive_bayes')"),
        ("model.pretrained_layers", -2, "an integer >= -1"),
        ("model.pretrained_init", "hub", "one of ('checkpoint', 'random')"),
        ("train.patience", -1, "an integer >= 0"),
        ("pretrain.mask_rate", 1.0, "in (0, 1)"),
        ("pretrain.head_vocab", 2, "0 or > 3"),
        ("pretrain.learning_rate", -1.0, "> 0"),
    ],
)
def test_values_out_of_range_are_named(name, value, fragment):
    config = default.get_config()
    section, field = name.split(".")
    with config.unlocked():
        config[section][field] = value
    with pytest.raises(UserError, match=rf"config\.{name} must be {re.escape(fragment)}; got "):
        fields.check(config)


def test_the_model_fields_that_are_not_the_model_are_read_from_the_table():
    assert fields.run_fields() == (
        "init_from",
        "pretrained",
        "pretrained_layers",
        "pretrained_init",
        "embeddings_from",
    )
    cfg = fields.model_config(default.get_config(), vocab_size=10, num_classes=2)
    assert not hasattr(cfg, "init_from") and cfg.d_model == default.get_config().model.d_model


@pytest.mark.parametrize("name, value", [("pretrained_layers", 0), ("pretrained_init", "random")])
def test_what_only_a_pretrained_encoder_has_is_refused_without_one(name, value):
    config = default.get_config()
    config.model[name] = value
    with pytest.raises(UserError, match=rf"model\.{name} needs a pretrained encoder"):
        fields.check(config)


def _with_new_fields(monkeypatch):
    """What a contributor writes to add two fields: one row each in fields.FIELDS and a value in
    the config (here set on a config from configs/default.py)."""
    monkeypatch.setitem(
        fields.FIELDS,
        "train.smoothing_steps",
        fields.Field(
            "steps the new knob smooths over; 0 = from the data",
            check=fields.integer(lambda v: v >= 0, "an integer >= 0"),
            auto=0,
            before=5,
        ),
    )
    monkeypatch.setitem(
        fields.FIELDS,
        "train.report_every_steps",
        fields.Field("how often the new report is written", resume=fields.MAY_CHANGE),
    )
    config = default.get_config()
    with config.unlocked():
        config.train.smoothing_steps = 7
        config.train.report_every_steps = 100
    return config


def test_a_new_field_needs_only_its_row_and_its_config_line(monkeypatch, tmp_path):
    config = _with_new_fields(monkeypatch)
    fields.check(config)
    # --print_config shows its meaning.
    assert re.search(
        r"^train\.smoothing_steps = 7 +# steps the new knob smooths over",
        fields.describe(config),
        re.M,
    )
    # Its check runs with the others.
    with config.unlocked():
        config.train.smoothing_steps = -1
    with pytest.raises(UserError, match=r"config\.train\.smoothing_steps must be an integer >= 0"):
        fields.check(config)
    # Its data-chosen mark is seen.
    with config.unlocked():
        config.train.smoothing_steps = 0
    assert "train.smoothing_steps" in fields.left_to_data(config)
    # Resume: a workdir's run refuses another value of a "same" field, accepts a "may change" one.
    workdir = str(tmp_path)
    with config.unlocked():
        config.train.smoothing_steps = 7
    workdirs.write_json(os.path.join(workdir, "config.json"), config.to_dict())
    with config.unlocked():
        config.train.report_every_steps = 50
    workdirs.check_same_run(config, workdir)
    with config.unlocked():
        config.train.smoothing_steps = 8
    with pytest.raises(UserError, match=r"train\.smoothing_steps: workdir 7 vs config 8"):
        workdirs.check_same_run(config, workdir)
    # A workdir written before the field existed reads as its run used it (`before`).
    saved = config.to_dict()
    del saved["train"]["smoothing_steps"]
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(saved, f)
    assert workdirs.read_config(os.path.join(workdir, "config.json")).train.smoothing_steps == 5
