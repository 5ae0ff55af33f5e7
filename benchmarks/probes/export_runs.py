"""attn's side of the export check: fine-tunes every family's tiny checkpoint (tests/data/encoders,
configs/finetune.py:tiny, a few steps) in both poolings, and all-MiniLM-L6-v2 when given, exports
each workdir (`python -m experiments.export`) and writes what transformers must reproduce:

  python benchmarks/probes/export_runs.py OUT [--minilm=DIR/all-MiniLM-L6-v2]
  REFVENV/bin/python benchmarks/transformers_check.py OUT/expected.json OUT/checked.json

OUT/expected.json: per run, its exported directory, a few texts, the checkpoint's ids attn reads
for each and predict's probabilities (`maps.analyse`, as predict computes them), and the whole
ids (special tokens around, nothing cut) attn's tokenizer gives of TOKENIZED (Chinese and a text
longer than any model here reads among them), which AutoTokenizer must give too. The MiniLM runs
are 30 steps of configs/finetune.py on the same small CSV.
"""

import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np

from attn import encoder_classifier
from experiments import cli, export, serving, train
from experiments.explain import maps

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "encoders"
FAMILIES = (
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "electra",
    "modernbert",
    "deberta-v2",
    "albert",
)
TEXTS = (
    "the film was great and superb",
    "An AWFUL, boring movie... I hated it!",
    "best fun ever 7/10",
    "the film 3 was dull and bad",
    "这部电影很好看",
)
# Tokenizer ids only: the long one is longer than the tiny encoders' positions.
TOKENIZED = (
    *TEXTS,
    "Ein Film über Café-Kultur — naïve, aber schön 😀",
    "我们今天去看了电影，剧情非常感人，演员的表演也很出色！",
    " ".join(f"sentence {i} of a long review, which goes on and on;" for i in range(60)),
)


def _csv(path: pathlib.Path) -> pathlib.Path:
    r = random.Random(0)
    pos, neg = ["great", "superb", "good", "loved", "fun"], ["awful", "boring", "dull", "bad"]
    rows = []
    for i in range(240):
        a, b = r.sample(pos if i % 2 else neg, 2)
        rows.append(f"the film {i} was {a} and {b},{'pos' if i % 2 else 'neg'}")
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def _run(out: pathlib.Path, name: str, flags: list[str]) -> dict:
    """Trains, exports and answers TEXTS as predict does: the expected entry of one run."""
    workdir = out / "runs" / name
    status = cli.run(train.define_flags, train.main, ["train", *flags, f"--workdir={workdir}"])
    assert status == 0, f"training {name} failed"
    exported = out / name
    status = cli.run(
        export.define_flags, export.main, ["export", f"--workdir={workdir}", f"--out={exported}"]
    )
    assert status == 0, f"exporting {name} failed"
    trained = serving.load(str(workdir))
    entry = {"dir": str(exported), "texts": list(TEXTS), "ids": [], "probabilities": []}
    tok = trained.tokenizer
    before, after = tok.frame
    entry["tokenized"] = {
        text: encoder_classifier.to_checkpoint(
            np.concatenate([before, tok.encode(text), after]).astype(np.int32),
            trained.cfg.encoder.pad_id,
        ).tolist()
        for text in TOKENIZED
    }
    for text in TEXTS:
        ids_L = serving.encode(trained, text)
        bag_G = serving.encode_bag(trained, text)
        probs = maps.analyse(trained.params, trained.cfg, ids_L, bag_G, trained.config.data)
        entry["probabilities"].append(np.asarray(probs["probs"], np.float64).tolist())
        own = encoder_classifier.to_checkpoint(ids_L, trained.cfg.encoder.pad_id)
        entry["ids"].append(np.asarray(own).tolist())
    return entry


def main(argv: list[str]) -> int:
    out = pathlib.Path(argv[1])
    minilm = next((a.split("=", 1)[1] for a in argv[2:] if a.startswith("--minilm=")), None)
    out.mkdir(parents=True, exist_ok=True)
    reviews = _csv(out / "reviews.csv")
    expected = {}
    for family in FAMILIES:
        for pooling in ("cls", "mean"):
            expected[f"{family}_{pooling}"] = _run(
                out,
                f"{family}_{pooling}",
                [
                    "--config=configs/finetune.py:tiny",
                    f"--config.model.pretrained={DATA / f'tiny_{family}'}",
                    f"--config.model.pooling={pooling}",
                    f"--config.data.path={reviews}",
                    "--config.train.max_steps=8",
                    "--config.train.baseline=False",
                ],
            )
    if minilm:
        for pooling in ("cls", "mean"):
            expected[f"minilm_{pooling}"] = _run(
                out,
                f"minilm_{pooling}",
                [
                    "--config=configs/finetune.py",
                    f"--config.model.pretrained={minilm}",
                    f"--config.model.pooling={pooling}",
                    f"--config.data.path={reviews}",
                    "--config.train.max_steps=30",
                    "--config.train.baseline=False",
                ],
            )
    (out / "expected.json").write_text(json.dumps(expected, indent=1), encoding="utf-8")
    print(f"wrote {out / 'expected.json'} ({len(expected)} exported runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
