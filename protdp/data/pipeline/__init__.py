"""The training input pipeline: compact integer host examples (`compact`), their expansion to
the model's features on the training device (`expand`) and an ordered, prefetching pool of
worker processes that builds them off the training thread (`pool`), and the trainer-side thread
that takes their results one micro-batch ahead (`ready`)."""
