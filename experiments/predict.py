"""Classifies texts with a trained workdir: label, probability and the most-attended words.

  python -m experiments.predict --workdir=runs/default "质量很好，很满意" "质量太差了"
  printf '很好\\n很差\\n' | python -m experiments.predict --workdir=runs/default
  python -m experiments.predict --workdir=runs/default --path=reviews.csv --out=labelled.csv
  python -m experiments.predict --pretrained=exported/ft "a dull film"

--pretrained=DIR_OR_HUB_ID answers with a transformers ...ForSequenceClassification as it is, no
workdir (an exported one, or a hub classifier of a family attn reads): its own head, labels and
tokenizer, reading up to its encoder's positions of a text.

Texts come from the arguments or, when there are none, one per line from standard input (blank
lines at the end are ignored). Stdout has one line per text, in input order, after a header:

  label  probability  most-attended words, each with the attention it receives

separated by tabs. A word's attention is the sum of its tokens' (a pretrained tokenizer's pieces,
"toast" "##er", make one word, "toaster"; attn's own tokens, characters or words, are each their
own); the tokens put around the text ([CLS], [SEP]), unknown ones and whitespace belong to no
word and are never listed, although a fine-tuned encoder often sends [CLS] and [SEP] the most
attention. With --json, one JSON object per text and no header. A text that cannot be
classified (empty, not UTF-8) gets the label `error` (`{"error": ...}` in JSON) and a one-line
error on stderr; the others are still answered, and the exit status is 2 if any text failed. A
text with no token the model knows (every character outside the vocabulary but for whitespace)
gets the label `unknown` and no probability: the model has nothing to go on. Stderr says which
checkpoint answers, and adds a line `note: text N: ...` for an answer that reads less than it
seems: a text cut to the model's length (`read the first N and last K of M tokens`, `read only
...` when most of it goes unread, then how to read more: --max_len=N reads up to N tokens where
the model can), one whose tokens are mostly outside the vocabulary (`mostly unknown: ...`), or
one written mostly in a script that was under 10% of the training texts' letters (`written in
Latin letters, which were 0.4% of ...`; workdirs trained before scripts.json was written skip
this); with --json the same words are the object's `note`.

--path=FILE classifies every row of a CSV/TSV/JSONL file instead, in batches (`serving.rows`):
its --text_field column (default: the training run's), its other columns kept, with the predicted
label, its probability, each class's probability and an error column added; written to --out
(.csv or .jsonl, a new file) or to stdout as CSV. Rows that cannot be classified get one line each
on stderr, and the exit status 2; the others are still answered.

--convert=t2s converts every text by that OpenCC conversion before the model reads it (t2s:
traditional Chinese to simplified, for a model trained on simplified text); by default texts are
converted as the run converted its own (data.convert), and --convert='' converts none. Stderr then
says how many texts the conversion changed; the words listed are the converted ones.

--explain adds three columns (`explain` in JSON): the top tokens by leave-one-out, each with the
drop of the probability when it alone is erased, and the probability once the 3 most-attended
tokens, then the 3 top leave-one-out tokens, are erased: a check of the attention column.
"""

import json
import sys

import numpy as np
from absl import flags

from experiments import cli, serving
from experiments.data import conversion
from experiments.errors import UserError
from experiments.explain import maps, ranking
from experiments.serving import rows

HEADER = "label\tprobability\tmost-attended words (attention received)"
UNKNOWN = "unknown"


def predict_one(trained: serving.Trained, text: str, top: int) -> dict:
    """`predict_read` of `text`, read here."""
    return predict_read(trained, serving.read(trained, text), top)


def predict_read(trained: serving.Trained, r: serving.Read, top: int) -> dict:
    """Label, its probability and the `top` most-attended words of one text read; label None and
    probability None when the text has no token in the vocabulary; `note` when the answer reads
    less than it seems (see the module docstring)."""
    seen = r.reading
    about = {
        "num_tokens": len(r.ids_L),
        "text_tokens": seen.text_tokens,
        "known_tokens": seen.known_tokens,
    }
    notes = [*seen.notes, serving.read_more(trained, seen.text_tokens)] if seen.cut else seen.notes
    about |= {"note": "; ".join(notes)} if notes else {}
    if not seen.known_tokens:
        return {"label": None, "probability": None, "top_tokens": [], **about}
    result = maps.analyse(trained.params, trained.cfg, r.ids_L, r.bag_G, trained.config.data)
    probs_C, received_L = result["probs"], result["received"]
    w = r.words
    real_L = w.of_L >= 0
    received_W = np.bincount(w.of_L[real_L], received_L[real_L], minlength=len(w.texts))
    order = np.argsort(-received_W, kind="stable")[:top]
    return {
        "label": trained.label_names[int(probs_C.argmax())],
        "probability": float(probs_C.max()),
        "top_tokens": [[w.texts[i], float(received_W[i])] for i in order],
        **about,
    }


def read_stdin_lines() -> list[str]:
    """Lines of stdin but blank ones at the end; undecodable ones are kept as surrogate-escaped
    text and refused later."""
    lines = sys.stdin.buffer.read().decode("utf-8", errors="surrogateescape").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def format_line(p: dict) -> str:
    """One text's answer as a tab-separated line under HEADER."""
    if "error" in p:
        return f"error\t-\t{p['error']}"
    if p["label"] is None:
        return f"{UNKNOWN}\t-\t{p['note']}"
    # Two significant digits: over a 512-token review a token's share is about 0.002, which a
    # fixed two decimals would print as 0.00 for every token.
    top = " ".join(f"{t}({w:.2g})" for t, w in p["top_tokens"])
    return f"{p['label']}\t{p['probability']:.3f}\t{top}"


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "A workdir written by experiments.train.", flag_values=fv)
    flags.DEFINE_string(
        "pretrained",
        None,
        "Instead of --workdir: a transformers ...ForSequenceClassification directory or hub id.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "path", None, "Classify every row of this CSV/TSV/JSONL file instead.", flag_values=fv
    )
    flags.DEFINE_string(
        "text_field", None, "--path's text column; default: the training run's.", flag_values=fv
    )
    flags.DEFINE_string(
        "out", None, "--path's output: a new .csv or .jsonl file; default: stdout.", flag_values=fv
    )
    flags.DEFINE_integer("top", 5, "How many most-attended words to show.", flag_values=fv)
    flags.DEFINE_integer(
        "max_len",
        None,
        "Read up to N tokens of each text (special tokens included) instead of the length the "
        "model was trained with, as far as it can: a pretrained encoder up to its positions "
        "(512 for BERT), attn's own model with sinusoidal or no positions; learned positions "
        "end at their table.",
        flag_values=fv,
    )
    flags.DEFINE_boolean(
        "explain",
        False,
        "Also the top tokens by leave-one-out and the probability once the 3 most-attended (and "
        "the 3 top leave-one-out) tokens are erased: whether attention found what counts.",
        flag_values=fv,
    )
    cli.define_convert_flag(fv)
    flags.DEFINE_boolean(
        "json",
        False,
        'Print one JSON object per text (failures as {"error": ...}) instead of text.',
        flag_values=fv,
    )


def main(fv: flags.FlagValues, argv: list[str]) -> int:
    if bool(fv.workdir) == bool(fv.pretrained):
        raise UserError("give one of --workdir=DIR and --pretrained=DIR_OR_HUB_ID")
    if fv.path is not None:
        if len(argv) > 1:
            raise UserError("pass texts or --path=FILE, not both")
        return predict_rows(fv)
    if fv.out is not None or fv.text_field is not None:
        raise UserError("--out and --text_field go with --path=FILE")
    texts = argv[1:] or read_stdin_lines()
    if not texts:
        raise UserError("no text given: pass texts as arguments or one per line on stdin")
    trained = _trained(fv)
    if not fv.json:
        print(HEADER + (ranking.HEADER if fv.explain else ""))
    failed = changed = 0
    for n, text in enumerate(texts, 1):
        try:
            r = serving.read(trained, text)
            changed += r.converted
            p = predict_read(trained, r, fv.top)
            if fv.explain and p["label"] is not None:
                p["explain"] = ranking.explain_read(trained, r, fv.top)
        except UserError as e:
            failed += 1
            print(f"error: text {n}: {e}", file=sys.stderr)
            p = {"error": str(e)}
        if p.get("label") and "note" in p:  # an unknown's note is its line on stdout
            print(f"note: text {n}: {p['note']}", file=sys.stderr)
        line = format_line(p) + (ranking.columns(p) if fv.explain else "")
        print(json.dumps(p, ensure_ascii=False) if fv.json else line, flush=True)
    conversion.report(trained.config.data.convert, changed, len(texts))
    return 2 if failed else 0


def _trained(fv: flags.FlagValues) -> serving.Trained:
    trained = serving.load(fv.workdir) if fv.workdir else serving.load_pretrained(fv.pretrained)
    if fv.max_len is not None:
        trained = serving.reading_up_to(trained, fv.max_len)
    trained = serving.converting(trained, fv.convert)
    print(f"answering from {trained.source}", file=sys.stderr)
    return trained


def predict_rows(fv: flags.FlagValues) -> int:
    """--path: every row of the file, answered as the module docstring says."""
    trained = _trained(fv)
    text_field = fv.text_field or trained.config.data.get("text_field", "text")
    table = rows.read(fv.path, text_field)
    rows.check_out(fv.out, fv.path, table, trained.label_names)
    changed = rows.predict(trained, table)
    rows.write(table, trained.label_names, fv.out)
    failed = [row for row in table.rows if row.error is not None]
    for row in failed:
        print(f"error: {row.where}: {row.error}", file=sys.stderr)
    answered = len(table.rows) - len(failed)
    where = f" to {fv.out}" if fv.out else ""
    print(f"{answered} of {len(table.rows)} rows answered{where}", file=sys.stderr)
    conversion.report(trained.config.data.convert, changed, answered)
    return 2 if failed else 0


if __name__ == "__main__":
    cli.main(define_flags, main)
