"""Writes the texts of the embedded reviews' test split to audit by hand (benchmarks/audit.py):
200 that confident learning flags as likely mislabelled and 100 it does not, shuffled, with an
empty `audited` column for the reader's label.

    python benchmarks/probes/audit_candidates.py OUT.csv
"""

import csv
import sys

from benchmarks import audit

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = audit.candidates(c=100.0)
    with open(sys.argv[1], "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label", "flagged", "audited"])
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} texts to {sys.argv[1]}")
