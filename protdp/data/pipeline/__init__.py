"""The training input pipeline: compact integer host examples (`compact`), their expansion to
the model's features on the training device (`expand`) and an ordered, prefetching pool of
worker processes that builds them off the training thread (`pool`), and the trainer-side thread
that takes their results one micro-batch ahead (`ready`). Tolerant mode (issue 44): a keyed pool
with per-family deadlines (`deadline_pool`), the micro-batches assembled with deterministic
replacements (`assemble`), the quarantine rules and records (`quarantine`), and the explicit
fault-injection hook of its tests and benchmark (`faults`)."""
