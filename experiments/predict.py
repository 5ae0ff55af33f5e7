"""Classifies texts with a trained workdir: label, probability and the most-attended tokens.

  python -m experiments.predict --workdir=runs/default "这本书很好看" "质量太差了"
  printf '很好\\n很差\\n' | python -m experiments.predict --workdir=runs/default

Texts come from the arguments or, when there are none, one per line from standard input.
A text that cannot be classified (empty, not UTF-8) gets a one-line error on stderr; the others
are still answered, and the exit status is 2 if any text failed.
"""

import json
import sys

import numpy as np
from absl import flags

from experiments import cli, forward, workdirs
from experiments.cli import UserError


def predict_one(trained: workdirs.Trained, text: str, top: int) -> dict:
    """Label, its probability and the `top` most-attended tokens of one text."""
    ids_L = workdirs.encode(trained, text)
    result = forward.analyse(trained.params, trained.cfg, ids_L)
    probs_C, received_L = result["probs"], result["received"]
    tokens = trained.tokenizer.tokens(ids_L.tolist())
    order = np.argsort(-received_L, kind="stable")[:top]
    return {
        "label": trained.label_names[int(probs_C.argmax())],
        "probability": float(probs_C.max()),
        "top_tokens": [[tokens[i], float(received_L[i])] for i in order],
        "num_tokens": len(ids_L),
    }


def read_stdin_lines() -> list[str]:
    """Lines of stdin; undecodable ones are kept as surrogate-escaped text and refused later."""
    data = sys.stdin.buffer.read()
    return data.decode("utf-8", errors="surrogateescape").splitlines()


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "A workdir written by experiments.train.", flag_values=fv)
    flags.DEFINE_integer("top", 5, "How many most-attended tokens to show.", flag_values=fv)
    flags.DEFINE_boolean(
        "json", False, "Print one JSON object per text instead of text.", flag_values=fv
    )


def main(fv: flags.FlagValues, argv: list[str]) -> int:
    if not fv.workdir:
        raise UserError("--workdir=DIR is required")
    texts = argv[1:] or read_stdin_lines()
    if not texts:
        raise UserError("no text given: pass texts as arguments or one per line on stdin")
    trained = workdirs.load(fv.workdir)
    failed = 0
    for n, text in enumerate(texts, 1):
        try:
            p = predict_one(trained, text, fv.top)
        except UserError as e:
            failed += 1
            print(f"error: text {n}: {e}", file=sys.stderr)
            continue
        if fv.json:
            print(json.dumps(p, ensure_ascii=False))
        else:
            top = " ".join(f"{t}({w:.2f})" for t, w in p["top_tokens"])
            print(f"{p['label']}\t{p['probability']:.3f}\t{top}")
    return 2 if failed else 0


if __name__ == "__main__":
    cli.main(define_flags, main)
