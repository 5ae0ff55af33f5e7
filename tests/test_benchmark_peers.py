"""The peers section (`python -m benchmarks peers`) on the tiny checkpoint, with stand-in peers
instead of PyTorch, ONNX Runtime and transformers (CI has none of them): one that agrees with
attn, one that does not, one not installed, one that fails to build. The numerics check on its
own, at its tolerance's edges."""

import json
import statistics

import jax
import numpy as np
import pytest
from conftest import ROOT

from attn import bert
from benchmarks import __main__ as bench_main
from benchmarks import docs, peers
from experiments import cli

TINY = ROOT / "tests" / "data" / "bert" / "tiny_bert"


def _stand_in(offset: float):
    """A peer computing attn's own forward, its hidden states moved by `offset`."""

    def make(setup: peers.Setup) -> peers.Side:
        params, enc = bert.load(setup.bert_dir)
        encode = jax.jit(bert.encode, static_argnums=1)

        def forward(ids, mask):
            h = np.asarray(encode(params, enc, ids, mask)) + offset
            m = np.asarray(mask, np.float32)[..., None]
            pooled = (h * m).sum(1) / m.sum(1)
            return h, pooled @ setup.head_w_DxC + setup.head_b_C

        def serve(batch):
            return lambda: forward(batch["tokens"], batch["mask"])[1]

        return peers.Side(
            version="test",
            threads="test",
            forward=forward,
            serve=serve,
            train=serve,  # a forward stands in for the step: only the harness is under test
            cold_start="pass",
        )

    return make


def _not_installed(setup):
    import framework_that_is_not_installed  # noqa: F401


def _broken(setup):
    raise RuntimeError("export failed\nsecond line")


def test_peers_section_times_only_the_peers_that_agree(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        peers,
        "PEERS",
        {
            "twin": _stand_in(0.0),
            "off": _stand_in(1e-2),
            "absent": _not_installed,
            "broken": _broken,
        },
    )
    monkeypatch.setattr(
        peers, "QUICK", {"train": ((2, 16),), "serve": (4, 16), "rounds": 3, "cold_rounds": 1}
    )
    argv = ["benchmarks", "peers", "--quick", f"--out={tmp_path}", f"--bert_dir={TINY}"]
    assert cli.run(bench_main.define_flags, bench_main.main, argv) == 0
    sec = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["peers"]

    assert sec["skipped"]["absent"].startswith("not installed (framework_that_is_not_installed)")
    assert sec["skipped"]["broken"] == "failed to build: RuntimeError: export failed"
    assert sec["numerics"]["twin"]["agrees"] and not sec["numerics"]["off"]["agrees"]
    assert sec["numerics"]["off"]["max_abs_hidden"] == pytest.approx(1e-2, rel=1e-3)
    assert list(sec["sides"]) == ["attn", "twin"]  # the one that disagrees is not timed
    assert sec["recipe"]["learning_rate"] == 1e-4 and sec["recipe"]["ema_decay"] == 0.99
    for row in [*sec["train"], sec["serve"]]:
        assert set(row) == {"batch", "L", "rounds", "attn", "twin"} and row["rounds"] == 3
        times = zip(row["attn"]["times_s"], row["twin"]["times_s"], strict=True)
        ratios = [a / p for a, p in times]
        assert row["twin"]["ratio"] == pytest.approx(statistics.median(ratios))
        q1, q3 = row["twin"]["ratio_quartiles"]
        assert q1 <= row["twin"]["ratio"] <= q3
    assert (sec["train"][0]["batch"], sec["train"][0]["L"]) == (2, 16)
    cold = sec["cold_start"]  # attn's loads tiny_bert and encodes in a new process
    assert cold["shape"] == [4, 16] and cold["attn"]["median_s"] > 0 and cold["twin"]["ratio"] > 0

    written = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert "## 9. Against its peers" in written
    assert "| fine-tuning step | 2 × 16 |" in written and "| off |" in written
    assert "| **no** |" in written and "| broken | skipped: failed to build" in written
    assert docs.peers({"peers": sec}).startswith("- attn / twin: fine-tuning step ")
    alone = {**sec, "sides": {"attn": sec["sides"]["attn"]}}  # every peer skipped
    for table in (docs.peers_table(sec), docs.peers_table(alone)):
        assert len({line.count("|") for line in table.splitlines()}) == 1, table

    assert cli.run(bench_main.define_flags, bench_main.main, argv[:4]) == 2
    assert "peers needs --bert_dir=DIR" in capsys.readouterr().err


def test_numerics_check_at_the_edges_of_its_tolerance():
    enc = bert.Config(vocab_size=10, d_model=8, num_layers=2, num_heads=2, d_ff=16)
    rng = np.random.default_rng(0)
    h = rng.normal(size=(2, 5, 8)).astype(np.float32)
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    w = rng.normal(size=(8, 2)).astype(np.float32)
    logits = rng.normal(size=(2, 2)).astype(np.float32)
    ours = (h, logits)
    tol = peers.tolerance(enc, float(np.abs(h[mask]).max()))
    assert tol == pytest.approx(4 * 2.0**-23 * 4 * 3 * np.abs(h[mask]).max())

    def agrees(dh: np.ndarray, dl: float = 0.0) -> bool:
        return peers.check(ours, (h + dh, logits + dl), mask, w, enc)["agrees"]

    assert agrees(np.full_like(h, 0.5 * tol))
    assert not agrees(np.full_like(h, 2 * tol))
    padding = np.zeros_like(h)
    padding[1, 4] = 1.0  # padding positions are not compared
    assert agrees(padding)
    tol_logits = peers.check(ours, ours, mask, w, enc)["tolerance_logits"]
    assert tol_logits == pytest.approx(tol * np.abs(w).sum(0).max())
    assert agrees(0.0, 0.5 * tol_logits) and not agrees(0.0, 2 * tol_logits)
    assert not agrees(np.full_like(h, np.nan))


def test_batches_pad_with_zeros_after_their_real_lengths():
    b = peers.make_batch(vocab_size=50, batch=64, length=16, seed=3)
    lengths = b["mask"].sum(1)
    assert lengths.min() >= 8 and lengths.max() <= 16 and len(set(lengths)) > 1
    assert (b["mask"] == (b["tokens"] != 0)).all()
    # Real tokens come first: each row is its mask's prefix.
    assert (np.cumprod(b["mask"], axis=1) == b["mask"]).all()
    assert b["weight"].sum() == 64 and set(b["label"]) == {0, 1}
