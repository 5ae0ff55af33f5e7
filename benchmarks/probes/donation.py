"""What donating the train state to the jitted step (`experiments/train.py`) saves.

  PYTHONPATH=. python benchmarks/probes/donation.py

The default config's full train step (adversarial loss included) on real training batches of the
shortest and the longest bucket, jitted with and without `donate_argnums=0`, interleaved
(`benchmarks.timing`); prints the median step time of each and their ratio. Without donation every
step allocates and writes new copies of the params and both Adam moments, dominated by the
131072x64 n-gram table.
"""

import functools
import itertools
import statistics

import jax

from benchmarks import config_file, timing
from benchmarks.train_step import stream, train_data
from experiments.training import classify, optim


def main() -> None:
    config = config_file("default.py")
    cfg, train = train_data(config)
    tx = optim.make_optimizer(config.optim, 1000)
    step = functools.partial(
        classify.train_step, cfg=cfg, tx=tx, **classify.loss_options(config.optim)
    )
    steps = {"plain": jax.jit(step), "donated": jax.jit(step, donate_argnums=0)}
    states = {k: optim.init_state(jax.random.key(0), cfg, tx) for k in steps}

    def run(name: str, batch: dict):
        # A donated state is gone after the call: every call continues from the state it returned.
        states[name], m = steps[name](states[name], batch)
        return m

    by_length: dict[int, dict] = {}
    for batch in itertools.islice(stream(config, train), 200):
        by_length.setdefault(batch["tokens"].shape[1], batch)
    for length in (min(by_length), max(by_length)):
        runs = {k: functools.partial(run, k, by_length[length]) for k in steps}
        timing.time_interleaved(runs, 1)  # compile
        ms = {k: 1000 * statistics.median(t) for k, t in timing.time_interleaved(runs, 40).items()}
        print(
            f"L={length}: plain {ms['plain']:.1f} ms, donated {ms['donated']:.1f} ms, "
            f"ratio {ms['donated'] / ms['plain']:.3f}"
        )


if __name__ == "__main__":
    main()
