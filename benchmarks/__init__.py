"""The benchmark package: `python -m benchmarks [attention|train|accuracy|multihost|all]`.

One module per section (`attention`, `train_step`, `accuracy`, `multihost`), the Flax twin the
train-step section compares against (`flax_twin`), timing helpers (`timing`) and the report
writer (`report`). `probes/` holds the one-off scripts that explain numbers in analysis.md.
"""

import os

import ml_collections

from experiments import cli

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def config_file(spec: str) -> ml_collections.ConfigDict:
    """configs/<spec> (e.g. "default.py:tiny"), read at run time."""
    return cli.load_config_file(os.path.join(CONFIGS, spec))


def as_row(config: ml_collections.ConfigDict, overrides: dict, quick: bool) -> None:
    """What every accuracy section does to a row's config, in place (unlocked by the caller):
    no baseline of its own (the section's tfidf row is the baseline, fitted once), the row's
    overrides ("section.field" -> value), and 4 steps with --quick."""
    config.train.baseline = False
    for name, value in overrides.items():
        section, field = name.split(".")
        config[section][field] = value
    if quick:
        config.train.max_steps = 4
