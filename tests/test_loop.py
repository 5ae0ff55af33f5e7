"""The train loop on a fake objective and a schedule value, without a model, data or config: it
keeps the best evaluation and the last checkpoints, stops early after `patience` stale
evaluations (and a rerun does not train on), reads each step's metrics only after the next step
is dispatched, and resumes a run that died to exactly the state an uninterrupted run reaches."""

import os
import re

import jax.numpy as jnp
import numpy as np
import pytest

from attn import classifier
from experiments import parallel
from experiments.errors import UserError
from experiments.training import checkpoints, loop, metrics, schedule

CFG = classifier.ModelConfig(vocab_size=8, num_classes=2, max_len=8, d_model=8, num_heads=2, d_ff=8)
BATCH = 8


def _schedule(
    total_steps: int, patience: int = 0, keep: int = 2, log_every: int = 1
) -> schedule.Schedule:
    return schedule.Schedule(
        total_steps=total_steps,
        learning_rate=1.0,
        warmup_steps=0,
        eval_every_steps=3,
        checkpoint_every_steps=3,
        log_every_steps=log_every,
        keep_checkpoints=keep,
        patience=patience,
        max_nonfinite=5,
    )


class Fake:
    """An objective whose state is a running sum of the step numbers it was fed (and a count of
    its steps standing for the optimizer's state, which the best checkpoint does not keep), whose
    validation accuracy at each evaluated step is scripted, and which records what the loop did."""

    def __init__(self, workdir: str, accuracy: dict[int, float], die_at: int | None = None):
        self.workdir, self.accuracy, self.die_at = workdir, accuracy, die_at
        self.stepped: list[int] = []
        self.compiled: list[int] = []  # the step from which a batch shape was compiled ahead
        self.logged_when_dispatched: dict[int, list[int]] = {}  # step -> train rows on disk then
        self.written = 0

    def run(self, total_steps: int, patience: int = 0, keep: int = 2, log_every: int = 1):
        return loop.run(
            loop.Run(
                workdir=self.workdir,
                schedule=_schedule(total_steps, patience, keep, log_every),
                dp=parallel.data_parallel({"batch_size": BATCH, "eval_batch_size": BATCH}),
                meta=checkpoints.new_meta(CFG, [], ema=False),
                init_state=lambda fresh: {"w": jnp.float32(0), "opt": 0 * STATE, "step": 0 * STEP},
                step=self.step,
                compile=lambda state, batch: self.compiled.append(int(state["step"])),
                batches=self.batches,
                evaluate=lambda state: {
                    "accuracy": self.accuracy[int(state["step"])],
                    "loss": 1 - self.accuracy[int(state["step"])],
                },
                served=lambda state: {"w": state["w"], "step": state["step"]},
                write_run_files=self.write_run_files,
            )
        )

    def batches(self, start: int):
        for step in range(start + 1, 10_000):
            yield {"x": np.full((BATCH,), step, np.float32)}

    def step(self, state, batch):
        step = int(state["step"]) + 1
        if step == self.die_at:
            raise RuntimeError("the machine went away")
        self.stepped.append(step)
        rows = metrics.read(self.workdir)
        self.logged_when_dispatched[step] = [r["step"] for r in rows if r["split"] == "train"]
        new = {"w": state["w"] + batch["x"][0], "opt": state["opt"] + 1, "step": state["step"] + 1}
        m = {
            "loss": jnp.float32(0.5),
            "loss_sum": batch["x"][0] * BATCH,  # a mean loss of the step number: rows differ
            "correct": jnp.float32(BATCH / 2),
            "count": jnp.float32(BATCH),
            "grad_norm": jnp.float32(1.0),
            "nonfinite_run": jnp.int32(0),
            "nonfinite_total": jnp.int32(0),
        }
        return new, m

    def write_run_files(self):
        self.written += 1


STATE, STEP = jnp.float32(1), jnp.int32(1)


def _restored(workdir: str, which: str, step: int, served: bool = False) -> dict:
    target = {"w": STATE, "step": STEP} if served else {"w": STATE, "opt": STATE, "step": STEP}
    with checkpoints.reader(workdir, which) as mngr:
        return checkpoints.restore(mngr, step, target)


def _steps_saved(workdir: str, which: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(workdir, which)) if n.isdigit())


ACCURACY = {3: 0.5, 6: 0.7, 9: 0.6, 12: 0.65, 15: 0.8}


def test_the_best_evaluation_and_the_last_checkpoints_are_kept(tmp_path):
    fake = Fake(str(tmp_path), ACCURACY)
    best = fake.run(total_steps=12)
    assert fake.stepped == list(range(1, 13)) and fake.written == 1
    assert int(best["step"]) == 6 and float(best["w"]) == sum(range(1, 7))  # restored, not last
    assert _steps_saved(str(tmp_path), checkpoints.BEST) == [6]
    assert _steps_saved(str(tmp_path), checkpoints.LAST) == [9, 12]  # keep_checkpoints=2
    validation = [r["step"] for r in metrics.read(str(tmp_path)) if r["split"] == "validation"]
    assert validation == [3, 6, 9, 12]


def test_metrics_are_read_one_step_late(tmp_path):
    fake = Fake(str(tmp_path), ACCURACY)
    fake.run(total_steps=6)
    # When step s is dispatched, step s - 1's metrics are still being computed: the log holds
    # steps up to s - 2 only, except right after an evaluation or a save, which reads them all.
    assert fake.logged_when_dispatched[2] == []
    assert fake.logged_when_dispatched[3] == [1]
    assert fake.logged_when_dispatched[4] == [1, 2, 3]  # step 3 evaluated and saved
    assert fake.logged_when_dispatched[5] == [1, 2, 3]
    train_rows = [r["step"] for r in metrics.read(str(tmp_path)) if r["split"] == "train"]
    assert train_rows == [1, 2, 3, 4, 5, 6]


def test_patience_stops_early_and_a_rerun_does_not_train_on(tmp_path, capsys):
    fake = Fake(str(tmp_path), ACCURACY)
    best = fake.run(total_steps=15, patience=2)
    assert fake.stepped == list(range(1, 13))  # evaluations 9 and 12 did not beat step 6
    assert int(best["step"]) == 6 and _steps_saved(str(tmp_path), checkpoints.LAST)[-1] == 12
    capsys.readouterr()
    again = Fake(str(tmp_path), ACCURACY)
    best_again = again.run(total_steps=15, patience=2)
    assert again.stepped == [] and int(best_again["step"]) == 6
    said = "resuming from step 12 of 15; nothing left to train (it stopped early there"
    assert said in capsys.readouterr().err


def test_a_run_that_died_resumes_to_the_uninterrupted_state(tmp_path):
    whole = Fake(str(tmp_path / "whole"), ACCURACY)
    whole.run(total_steps=12)
    died = Fake(str(tmp_path / "died"), ACCURACY, die_at=8)
    with pytest.raises(RuntimeError, match="went away"):
        died.run(total_steps=12)
    assert _steps_saved(str(tmp_path / "died"), checkpoints.LAST) == [3, 6]
    resumed = Fake(str(tmp_path / "died"), ACCURACY)
    resumed.run(total_steps=12)
    assert resumed.stepped == list(range(7, 13))  # from the last complete checkpoint on
    for workdir in ("whole", "died"):
        state, meta = _restored(str(tmp_path / workdir), checkpoints.LAST, 12)
        assert float(state["w"]) == sum(range(1, 13)) and meta["best_val_accuracy"] == 0.7
    # The dead run's rows past step 6 are replaced, not repeated.
    rows = {
        w: [(r["step"], r["split"]) for r in metrics.read(str(tmp_path / w))]
        for w in ("whole", "died")
    }
    assert rows["died"] == rows["whole"]


def test_the_best_checkpoint_keeps_the_served_part_and_one_last_state_resumes(tmp_path):
    whole = Fake(str(tmp_path / "whole"), ACCURACY)
    best = whole.run(total_steps=12, keep=1)
    assert set(best) == {"w", "step"} and float(best["w"]) == sum(range(1, 7))
    assert _steps_saved(str(tmp_path / "whole"), checkpoints.LAST) == [12]
    state, _ = _restored(str(tmp_path / "whole"), checkpoints.LAST, 12)
    assert int(state["opt"]) == 12  # the last checkpoint keeps what resuming needs
    kept, _ = _restored(str(tmp_path / "whole"), checkpoints.BEST, 6, served=True)
    assert float(kept["w"]) == sum(range(1, 7)) and int(kept["step"]) == 6
    with pytest.raises(UserError, match="cannot restore checkpoint"):  # no "opt" in best/
        _restored(str(tmp_path / "whole"), checkpoints.BEST, 6)
    died = Fake(str(tmp_path / "died"), ACCURACY, die_at=8)
    with pytest.raises(RuntimeError, match="went away"):
        died.run(total_steps=12, keep=1)
    assert _steps_saved(str(tmp_path / "died"), checkpoints.LAST) == [6]
    resumed = Fake(str(tmp_path / "died"), ACCURACY)
    resumed.run(total_steps=12, keep=1)
    assert resumed.stepped == list(range(7, 13))
    again, _ = _restored(str(tmp_path / "died"), checkpoints.LAST, 12)
    assert (float(again["w"]), int(again["opt"])) == (float(state["w"]), 12)


def test_a_run_compiles_its_batch_shapes_ahead_and_a_resumed_one_says_what_to_expect(
    tmp_path, capsys
):
    accuracy = {step: 0.5 for step in range(3, 61, 3)}
    died = Fake(str(tmp_path), accuracy, die_at=8)
    with pytest.raises(RuntimeError, match="went away"):
        died.run(total_steps=60)
    assert died.compiled == [0]  # one shape, before the first step
    assert "compiling 1 batch shape ... done in " in capsys.readouterr().err
    resumed = Fake(str(tmp_path), accuracy)
    resumed.run(total_steps=60)
    err = capsys.readouterr().err
    assert resumed.compiled == [6] and "resuming from step 6 of 60" in err
    assert "compiling 1 batch shape ... done in " in err
    assert re.search(
        r"expected: .* for 54 steps .*compiled ahead in \d+ s\), plus 18 evaluations", err
    )


def test_a_resumed_runs_train_rows_average_the_same_steps(tmp_path):
    # Logged every 5 steps and saved every 3: the step-10 row averages steps 6-10. A run resumed
    # from step 6 used to average only 7-10, the steps it had stepped itself.
    whole = Fake(str(tmp_path / "whole"), ACCURACY)
    whole.run(total_steps=12, log_every=5)
    died = Fake(str(tmp_path / "died"), ACCURACY, die_at=8)
    with pytest.raises(RuntimeError, match="went away"):
        died.run(total_steps=12, log_every=5)
    Fake(str(tmp_path / "died"), ACCURACY).run(total_steps=12, log_every=5)
    wall_clock = ("examples_per_sec", "input_wait_fraction")
    rows = {
        w: [
            {k: v for k, v in r.items() if k not in wall_clock}
            for r in metrics.read(str(tmp_path / w))
        ]
        for w in ("whole", "died")
    }
    train = [(r["step"], r["loss"]) for r in rows["whole"] if r["split"] == "train"]
    assert train == [(5, 3.0), (10, 8.0), (12, 11.5)]
    assert rows["died"] == rows["whole"]
