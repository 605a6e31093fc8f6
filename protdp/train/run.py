"""`pretrain(args)`: one rank's training run, the trainer chosen by the store's kind: a family
store trains the monomer model (`protdp.train.trainer.Trainer`), a complex store
(`protdp complex store`) fine-tunes the multimer model (`protdp.train.complex.ComplexTrainer`,
a subclass of the monomer trainer, which is why the choice lives in neither module).
"""

from __future__ import annotations

from protdp.train.args import TrainArgs
from protdp.train.trainer import Trainer


def pretrain(args: TrainArgs) -> dict:
    """Run pretraining in this process (one rank of a launched job, or a world of 1); a complex
    store (`protdp complex store`) trains the multimer model (`protdp.train.complex`)."""
    from protdp.complex.store import is_complex_store

    if args.data and is_complex_store(args.data):
        from protdp.train.complex import ComplexTrainer

        return ComplexTrainer(args).train()
    return Trainer(args).train()
