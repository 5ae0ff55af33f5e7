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
