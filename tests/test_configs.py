"""Config files: each loads its variants, refuses any other in one line, and builds a model."""

import importlib

import pytest
from conftest import ROOT, make_aclimdb, run_here

from attn import classifier
from experiments import fields
from experiments.data import chosen

VARIANTS = {
    "default": (None, "tiny", "structured", "pretrained"),
    "csv": (None, "tiny"),
    "imdb": (None, "tiny", "pretrained"),
    "sst2": (None, "tiny"),
    "lra_text": (None, "4k", "tiny"),
    "finetune": (None, "tiny", "imdb", "imdb_cpu", "sst2", "bag"),
    "distill": (None, "csv", "tiny"),
}


def test_every_config_file_is_listed():
    files = {p.stem for p in (ROOT / "configs").glob("*.py") if "def get_config" in p.read_text()}
    assert files == set(VARIANTS)


@pytest.mark.parametrize("name", VARIANTS)
def test_variants_load_and_make_a_valid_model(name, tmp_path):
    module = importlib.import_module(f"configs.{name}")
    reviews = tmp_path / "reviews.csv"
    reviews.write_text("text,label\n" + "".join(f"review {i},{i % 2}\n" for i in range(60)))
    make_aclimdb(tmp_path / "aclImdb")
    for arg in VARIANTS[name]:
        config = module.get_config(arg)
        if config.data.tokenizer == "pretrained":  # finetune.py: the checkpoint's tokenizer
            with config.unlocked():
                config.model.pretrained = str(ROOT / "tests" / "data" / "bert" / "tiny_bert")
        if fields.left_to_data(config):  # csv.py and imdb.py leave some fields to the data
            if config.data.dataset in ("file", "imdb_reviews"):  # sst2: only the learning rate
                with config.unlocked():
                    imdb = config.data.dataset == "imdb_reviews"
                    config.data.path = str(tmp_path / "aclImdb" if imdb else reviews)
            config = chosen.resolve(config)
        fields.check(config)
        cfg = fields.model_config(config, vocab_size=100, num_classes=2)
        assert isinstance(cfg, classifier.ModelConfig) and cfg.max_len == config.data.max_len


@pytest.mark.parametrize("name", VARIANTS)
def test_unknown_variant_is_one_line(name, capsys):
    proc = run_here("experiments.data_info", f"--config=configs/{name}.py:foo", capsys=capsys)
    assert proc.returncode == 2 and proc.stdout == ""
    valid = ", ".join(v for v in VARIANTS[name] if v)
    assert proc.stderr.splitlines() == [
        f"error: flag --config=configs/{name}.py:foo: Error whilst parsing config file: "
        f"ValueError: unknown variant 'foo' of configs/{name}.py; valid: {valid}"
    ]


def test_sst2_uses_the_word_model_and_imdb_the_bag():
    from configs import imdb, sst2

    a, b = imdb.get_config(), sst2.get_config()
    assert (a.data.tokenizer, b.data.tokenizer) == ("word", "word")
    assert (b.model.d_model, b.model.num_layers, b.model.ngram_buckets) == (128, 2, 0)
    assert a.model.bag_buckets > 0 and a.model.bag_orders == (1, 2) and b.model.bag_buckets == 0
    assert (a.data.dataset, b.data.dataset) == ("imdb_reviews", "glue/sst2")
    assert a.optim.bag_init == "naive_bayes" and a.optim.adversarial_relative  # csv.py's recipe


def test_pretrained_variants_pretrain_first_and_change_nothing_else_of_the_model():
    from configs import default, imdb

    for module in (default, imdb):
        plain, pretrained = module.get_config(), module.get_config("pretrained")
        assert plain.pretrain.num_epochs == 0 and pretrained.pretrain.num_epochs > 0
        assert pretrained.model.to_dict() == plain.model.to_dict()
        assert pretrained.data.to_dict() == plain.data.to_dict()
    # A pretrained encoder is moved by a relative eps, as csv.py's recipe (and so imdb.py's) is.
    assert default.get_config("pretrained").optim.adversarial_relative


def test_print_config_shows_values_with_overrides_and_meanings(tmp_path, capsys):
    workdir = tmp_path / "w"
    argv = ["--config=configs/default.py:tiny", "--print_config", "--config.model.d_model=8"]
    proc = run_here("experiments.train", *argv, f"--workdir={workdir}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(fields.FIELDS) and all(
        " = " in line and " # " in line for line in lines
    )
    assert any(
        line.startswith("model.d_model = 8 ") and line.endswith("# width of the token vectors")
        for line in lines
    ), proc.stdout
    assert not workdir.exists()  # nothing trained, nothing written


def test_print_config_shows_what_the_data_chooses(tmp_path, capsys):
    """csv.py's data-chosen fields are printed as a run would set them; without a readable file
    they stay marked, and the fields are listed all the same."""
    path = tmp_path / "en.csv"
    rows = [f"the film was {'great' if i % 2 else 'dull'} {i},{i % 2}" for i in range(60)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n", "utf-8")
    args = ["--config=configs/csv.py", "--print_config", f"--workdir={tmp_path / 'w'}"]
    proc = run_here("experiments.train", *args, f"--config.data.path={path}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    values = dict(line.split(" # ")[0].split(" = ") for line in proc.stdout.splitlines())
    values = {k.strip(): v.strip() for k, v in values.items()}
    assert values["data.tokenizer"] == "'word'" and values["data.max_len"] == "32"
    assert values["data.tail_len"] == "24" and values["train.num_epochs"] == "10"
    proc = run_here("experiments.train", *args, capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert "data.tokenizer = 'auto'" in proc.stdout and "data.tail_len = -1" in proc.stdout
    assert "cannot read it: data.path is empty" in proc.stderr
    assert not (tmp_path / "w").exists()


def test_finetunes_file_variants_average_their_weights_and_the_others_do_not():
    """configs/finetune.py and :bag serve a running average (chosen on validation beside the same
    recipes without it); the IMDB and SST-2 variants have none, unmeasured with it."""
    from configs import finetune

    bag, plain, imdb_cpu, sst2 = (finetune.get_config(v) for v in ("bag", None, "imdb_cpu", "sst2"))
    assert bag.optim.ema_decay == plain.optim.ema_decay == -1  # from the run's length
    assert bag.model.bag_buckets == 1 << 20
    assert imdb_cpu.optim.ema_decay == sst2.optim.ema_decay == 0.0
    bag.model.bag_buckets, bag.model.bag_orders = 0, (1, 2)
    bag.optim.bag_init = "zeros"
    assert bag.to_dict() == plain.to_dict()  # the bag and the average, nothing else
