"""Training: one run setup for every objective, the loop that runs it, and what the loop needs.

`pipeline` holds a whole run of each objective (what the train and pretrain commands call);
`loop.run` trains any objective: classification (`classify`) or masked tokens (`masked_tokens`).
`optim` builds the optimizer and the train state, `checkpoints` saves and resumes them, `metrics`
and `progress` log and show the steps, `warm_start` and `bag_prior` say where parameters start,
and `baseline` fits the TF-IDF model every run is compared with.
"""
