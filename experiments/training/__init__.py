"""Training: one run setup for every objective, the loop that runs it, and what the loop needs.

`loop.run` trains any objective: classification (`classify`) or masked tokens (`masked_lm`).
`optim` builds the optimizer and the train state, `checkpoints` saves and resumes them, `metrics`
and `progress` log and show the steps, `warm_start` and `bag_prior` say where parameters start,
and `baseline` fits the TF-IDF model every run is compared with.
"""
