"""What a distillation run adds to a classification run (`pipeline`): the transfer set it trains
on (`transfer.build`, encoded as the student reads texts), its teacher (`teacher.load`, every
refusal before anything is written) and the batches that carry the teacher's logits.

With distill.augment and no teacher, the run trains on the augmented copies with their texts'
labels: augmentation alone, which tells what the copies bring from what the teacher does.

The teacher's logits are computed (or read back, `teacher.outputs`) when the loop first asks for
batches: after every check of the run has passed, and never for a run with nothing left to
train. A transfer text without a label of its own carries the teacher's choice as its label,
which only the train accuracy reads: the loss is the teacher's alone there.
"""

import dataclasses
import functools
from collections.abc import Iterator

import ml_collections
import numpy as np

from experiments import parallel
from experiments.data import batching, encoding, tokenizers, transfer, unlabeled
from experiments.training import teacher as teachers


@dataclasses.dataclass(frozen=True)
class Transfer:
    """A run's transfer set, encoded: what it trains on instead of the training split."""

    split: encoding.Split  # its texts, the student's ids, labels (see `labels`), bag ids
    labelled: np.ndarray  # bool [N]: the label is the text's own (a training text)
    teacher: teachers.Teacher | None
    workdir: str
    summary: str

    def batches(
        self, config: ml_collections.ConfigDict, dp: parallel.DataParallel, start: int
    ) -> Iterator[dict]:
        """The training stream over the transfer set from step `start` (`batching.train_stream`),
        with the teacher's logits ("teacher" [B, C]) and "labelled" [B] when there is one."""
        labels, extra = self.arrays
        d = config.data
        return batching.train_stream(
            self.split.ids,
            labels,
            seed=config.train.seed,
            start_step=start,
            rows=dp.rows(d.batch_size),
            bag_ids=self.split.bag_ids,
            extra=extra,
            **batching.options(d),
        )

    @functools.cached_property
    def arrays(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The labels int32 [N] the batches carry, and their per-example arrays: the teacher's
        logits [N, C] and "labelled" [N] (none without a teacher), computed on first use."""
        labels = self.split.labels
        if self.teacher is None:
            return labels, {}
        logits_NxC = teachers.outputs(self.teacher, self.split.texts, self.workdir)
        labels = np.where(self.labelled, labels, logits_NxC.argmax(-1)).astype(np.int32)
        return labels, {"teacher": logits_NxC, "labelled": self.labelled.astype(np.float32)}


def tokenizer(config: ml_collections.ConfigDict, workdir: str) -> tokenizers.Tokenizer | None:
    """The student's tokenizer when a teacher labels data.unlabeled's texts too: built from them
    and the training split's, as pretraining builds it, so that words the labels never show get
    rows the teacher's answers can train (or the workdir's, on resume); None otherwise (the
    training split's, as any run's)."""
    if not (config.distill.teacher and unlabeled.sources(config.data)):
        return None
    texts = unlabeled.load(config.data)
    return encoding.tokenizer_for(config.data, texts.train, workdir)


def prepare(config: ml_collections.ConfigDict, data: encoding.Encoded, workdir: str) -> Transfer:
    """The transfer set of a run of `config` whose data is `data` (its splits, tokenizer and
    labels), with its teacher loaded and checked; UserError for a teacher `teacher.load` refuses."""
    d, t = config.data, config.distill
    train = data.splits["train"]
    held = [*data.splits["validation"].texts, *data.splits["test"].texts]
    teacher = None
    if t.teacher:
        teacher = teachers.load(
            t.teacher,
            workdir=workdir,
            data=d,
            label_names=data.label_names,
            train_texts=train.texts,
        )
    texts = transfer.build(
        train.texts,
        train.labels,
        held,
        copies=t.augment,
        mask_rate=t.mask_rate,
        ngram_rate=t.ngram_rate,
        # Texts without a label are of use only with a teacher to give them one.
        sources=unlabeled.sources(d) if teacher else (),
        text_field=d.get("text_field", "text"),
        data_dir=d.get("data_dir") or None,
        convert=d.get("convert", ""),
    )
    split = encoding.encode_split(
        data.tokenizer, texts.texts, texts.labels, d, add_cls=config.model.pooling == "cls"
    )
    summary = texts.summary + (f"; {teacher.describe()}" if teacher else "")
    return Transfer(split, texts.labelled, teacher, workdir, summary)
