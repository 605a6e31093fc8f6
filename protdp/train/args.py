"""Megatron-style command-line flags for pretraining, mapped 1:1 onto a dataclass.

Megatron-LM names (`--micro-batch-size`, `--global-batch-size`, `--overlap-grad-reduce`,
`--use-distributed-optimizer`, `--train-iters`, `--save`, `--load`, `--lr-decay-style`, ...)
so cluster users can start with the flags they know. Precedence: dataclass defaults <
YAML file given by `--config configs/train/X.yaml` (keys are the flag names with `_` or `-`)
< explicit flags. Every field has a one-line help text; validation happens in
`__post_init__` (static checks; the engine's own through `ParallelConfig.validate`) and
`check_world` (checks that need the launcher's world size), all before any model is built, with
errors that name the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

from protdp.config import from_dict, read_yaml
from protdp.data.pipeline.quarantine import (DEADLINE_FLOOR_S, DEADLINE_MULTIPLE, MAX_STRIKES,
                                             DeadlinePolicy)
from protdp.resources import resolve_config
from protdp.errors import ConfigError
from protdp.parallel.config import ParallelConfig, batch_arithmetic

LR_DECAY_STYLES = ("constant", "linear", "cosine")
ENGINES = ("protdp", "deepspeed")
WANDB_MODES = ("offline", "online", "disabled")


def _f(default, help_text: str, **kw):
    """A dataclass field carrying its flag's help text."""
    return field(default=default, metadata={"help": help_text, **kw})


@dataclass
class TrainArgs(ParallelConfig):
    """All pretraining options; field `foo_bar` is flag `--foo-bar` and YAML key `foo_bar`.

    The engine knobs are `ParallelConfig`'s own fields (inherited: one definition, one default,
    one validator); `parallel_config()` hands them to the engine by field name, as Megatron maps
    its args onto `DistributedDataParallelConfig`."""

    # --- data / model
    data: str | None = _f(None, "HDF5 family store built by `protdp data build` (required); a "
                          "complex store (`protdp complex store`) fine-tunes AlphaFold-Multimer")
    model_config: str | None = _f(None, "model YAML (configs/model/{tiny,small,af2}.yaml); default: "
                                  "the --finetune-from checkpoint's model, else small")
    finetune_from: str | None = _f(None, "start from the model weights (EMA if saved) of a model "
                                   "file, an imported AlphaFold/OpenFold checkpoint or a training "
                                   "run; fresh optimizer state, schedule and EMA")
    crop_size: int = _f(256, "contiguous crop length in residues (AF2 initial training: 256)")
    max_msa_rows: int = _f(128, "MSA rows sampled per example, query first (AF2 N_clust: 128)")
    max_extra_msa_rows: int = _f(1024, "extra-MSA rows per example for models with the extra-MSA "
                                 "stack (AF2 training: 1024)")
    distillation_data: str | None = _f(None, "HDF5 store of self-distillation families (reviewer-"
                                       "approved predictions: `protdp review export --format "
                                       "store`), mixed into training")
    distillation_fraction: float = _f(0.75, "fraction of micro-batches drawn from "
                                      "--distillation-data (AF2: 75 %% distillation, 25 %% PDB)")
    distillation_loss_weight: float = _f(1.0, "loss weight of distillation micro-batches")
    data_workers: int | None = _f(None, "processes per rank that featurize micro-batches ahead of the "
                                  "step (0: in the training thread; default: the rank's cores - 1, "
                                  "0..8)")
    prefetch_depth: int | None = _f(None, "micro-batches prepared ahead per rank (default 2 x "
                                    "--data-workers, at least 2)")
    data_timeout: float = _f(300.0, "seconds a data worker may make no progress before the run "
                             "stops with an error naming the families; also the longest "
                             "per-family deadline")
    data_deadline_multiple: float = _f(DEADLINE_MULTIPLE, "a family whose featurization takes longer "
                                       "than max(--data-deadline-floor, this x the running median) "
                                       "is set aside for the step, replaced by the next family of "
                                       "the rank's shard and recorded in RUN/quarantine.jsonl "
                                       "(with --data-workers >= 1); 0: no deadlines")
    data_deadline_floor: float = _f(DEADLINE_FLOOR_S, "seconds: the per-family deadline is never shorter")
    quarantine_strikes: int = _f(MAX_STRIKES, "a family set aside this many times on a rank is never "
                                 "tried again in the run")
    val_fraction: float = _f(0.1, "fraction of families held out for validation (at least one if > 0)")
    val_families: str | None = _f(None, "comma-separated family ids to hold out (overrides --val-fraction)")
    # --- parallelism: every ParallelConfig field (Megatron names), plus
    distributed_timeout_minutes: float = _f(10.0, "timeout for every collective; a hung peer errors after it")
    engine: str = _f("protdp", "data-parallel engine: protdp (this package's Megatron-style engine) | "
                               "deepspeed (DeepSpeed ZeRO, pip install 'protdp[deepspeed]')")
    zero_stage: int = _f(1, "--engine deepspeed: ZeRO stage 1 (optimizer state sharded) or 2 "
                            "(+ gradients)")
    # --- optimisation (AF2 supplement 1.11.3 defaults)
    train_iters: int = _f(200, "optimizer steps to train for")
    lr: float = _f(1e-3, "peak learning rate after warmup (AF2: 1e-3)")
    min_lr: float = _f(0.0, "learning rate at the end of decay")
    lr_warmup_iters: int = _f(0, "linear warmup steps from 0 to --lr (AF2: 1000)")
    lr_decay_style: str = _f("linear", "decay after warmup: " + "|".join(LR_DECAY_STYLES))
    lr_decay_iters: int | None = _f(None, "steps over which lr decays to --min-lr (default --train-iters)")
    weight_decay: float = _f(0.0, "AdamW decoupled weight decay (AF2: 0)")
    adam_beta1: float = _f(0.9, "Adam beta1")
    adam_beta2: float = _f(0.999, "Adam beta2")
    adam_eps: float = _f(1e-6, "Adam epsilon (AF2: 1e-6)")
    clip_grad: float = _f(0.1, "global gradient-norm clip (AF2: 0.1); 0 disables")
    ema_decay: float = _f(0.999, "decay of the exponential moving average of weights (AF2: 0.999)")
    seed: int = _f(1234, "random seed (data order, features, dropout, recycles)")
    # --- checkpoints
    save: str | None = _f(None, "checkpoint directory to save to")
    save_interval: int | None = _f(None, "save every N iterations (and at the end)")
    load: str | None = _f(None, "checkpoint directory to resume from (latest complete checkpoint)")
    keep_last: int = _f(3, "number of most recent checkpoints kept in --save")
    release_check: bool = _f(True, "after each save rank 0 runs `protdp release` on the checkpoint "
                             "as a background job, one at a time, newest next (log: "
                             "iter_N/release.log; the final one is waited for): accuracy, "
                             "calibration, red-team, screening -> iter_N/release.json "
                             "(complex fine-tuning: the run folder's)")
    # --- evaluation and logging
    eval_interval: int = _f(50, "validate every N iterations on held-out families (EMA weights)")
    eval_iters: int = _f(8, "held-out examples evaluated per rank per validation")
    log_interval: int = _f(10, "print a breakdown line every N iterations (metrics.jsonl gets every step)")
    log_dir: str | None = _f(None, "run directory for metrics.jsonl and wandb (default: --save, else runs/pretrain)")
    wandb_mode: str = _f("offline", "wandb mode: " + "|".join(WANDB_MODES))
    wandb_project: str = _f("protdp", "wandb project name")
    wandb_exp_name: str | None = _f(None, "wandb run name")
    progress_bar: bool = _f(True, "tqdm progress bar on rank 0 (when stderr is a terminal)")
    compile: bool = _f(False, "torch.compile each Evoformer block (protdp.model.compile): about a "
                              "minute of compiling per input shape; on CPU no faster than eager")

    def __post_init__(self):
        def bad(flag: str, msg: str):
            raise ConfigError(f"--{flag}: {msg}")

        self.validate()          # ParallelConfig's rules (batch arithmetic once dp is known)
        for name in ("train_iters", "crop_size", "max_msa_rows", "keep_last", "eval_interval",
                     "log_interval"):
            if getattr(self, name) < 1:
                bad(name.replace("_", "-"), f"must be >= 1, got {getattr(self, name)}")
        for name in ("save_interval", "lr_decay_iters"):
            v = getattr(self, name)
            if v is not None and v < 1:
                bad(name.replace("_", "-"), f"must be >= 1, got {v}")
        for name in ("data_workers", "prefetch_depth"):
            v = getattr(self, name)
            if v is not None and v < 0:
                bad(name.replace("_", "-"), f"must be >= 0, got {v}")
        if self.data_timeout <= 0:
            bad("data-timeout", f"must be > 0, got {self.data_timeout}")
        if self.data_deadline_multiple < 0 or self.data_deadline_floor <= 0 or self.quarantine_strikes < 1:
            bad("data-deadline-multiple / --data-deadline-floor / --quarantine-strikes",
                "need multiple >= 0, floor > 0, strikes >= 1, got "
                f"{self.data_deadline_multiple}, {self.data_deadline_floor}, {self.quarantine_strikes}")
        if self.eval_iters < 0:
            bad("eval-iters", f"must be >= 0, got {self.eval_iters}")
        if self.lr_warmup_iters < 0:
            bad("lr-warmup-iters", f"must be >= 0, got {self.lr_warmup_iters}")
        if self.lr <= 0:
            bad("lr", f"must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            bad("min-lr", f"must be in [0, --lr={self.lr}], got {self.min_lr}")
        if self.lr_decay_style not in LR_DECAY_STYLES:
            bad("lr-decay-style", f"'{self.lr_decay_style}' is not one of {'|'.join(LR_DECAY_STYLES)}")
        if self.lr_warmup_iters > self.decay_iters:
            bad("lr-warmup-iters", f"{self.lr_warmup_iters} exceeds the decay horizon "
                f"{self.decay_iters} (--lr-decay-iters or --train-iters)")
        if not 0 <= self.ema_decay < 1:
            bad("ema-decay", f"must be in [0, 1), got {self.ema_decay}")
        if self.clip_grad < 0:
            bad("clip-grad", f"must be >= 0, got {self.clip_grad}")
        if not 0 <= self.distillation_fraction <= 1:
            bad("distillation-fraction", f"must be in [0, 1], got {self.distillation_fraction}")
        if self.distillation_loss_weight < 0:
            bad("distillation-loss-weight", f"must be >= 0, got {self.distillation_loss_weight}")
        if not 0 <= self.val_fraction < 1:
            bad("val-fraction", f"must be in [0, 1), got {self.val_fraction}")
        if self.wandb_mode not in WANDB_MODES:
            bad("wandb-mode", f"'{self.wandb_mode}' is not one of {'|'.join(WANDB_MODES)}")
        if self.save_interval is not None and self.save is None:
            bad("save-interval", "needs --save DIR to know where to write checkpoints")
        if self.engine not in ENGINES:
            bad("engine", f"'{self.engine}' is not one of {'|'.join(ENGINES)}")
        if self.zero_stage not in (1, 2):
            bad("zero-stage", f"DeepSpeed ZeRO stage 1 or 2, got {self.zero_stage}")
        if self.engine == "deepspeed" and self.overlap_param_gather:
            bad("overlap-param-gather", "is protdp's engine; DeepSpeed ZeRO-1/2 gather the "
                "updated parameters inside its step (drop the flag)")

    @property
    def decay_iters(self) -> int:
        return self.lr_decay_iters if self.lr_decay_iters is not None else self.train_iters

    def check_batch(self, dp: int) -> int:
        """Accumulation steps at data-parallel size `dp` (`batch_arithmetic` validates)."""
        return batch_arithmetic(self.micro_batch_size, dp, self.global_batch_size)[1]

    def check_world(self, world_size: int) -> "TrainArgs":
        """Resolve the data-parallel size from the launcher's world and validate it."""
        dp = self.data_parallel_size
        if dp is None:
            dp = world_size // self.dap_size
        expected = (dp * self.dap_size * self.tensor_model_parallel_size
                    * self.pipeline_model_parallel_size)
        if expected != world_size:
            raise ConfigError(
                f"--data-parallel-size {dp} x --dap-size {self.dap_size} x tensor 1 x pipeline 1 = "
                f"{expected} does not match the "
                f"world size {world_size} given by the launcher; launch with "
                f"`torchrun --nproc_per_node {expected} ...` (or `mpirun -np {expected}`) or pass "
                f"--data-parallel-size {world_size // self.dap_size}")
        return dataclasses.replace(self, data_parallel_size=dp)

    def parallel_config(self) -> ParallelConfig:
        """The engine's config, field by field (Megatron maps args onto its core configs so)."""
        return ParallelConfig(**{f.name: getattr(self, f.name)
                                 for f in dataclasses.fields(ParallelConfig)})

    def deadline_policy(self) -> DeadlinePolicy | None:
        """The tolerant feed's per-family deadline (None: --data-deadline-multiple 0)."""
        if self.data_deadline_multiple == 0:
            return None
        return DeadlinePolicy(self.data_deadline_multiple, self.data_deadline_floor,
                              cap_s=self.data_timeout, max_strikes=self.quarantine_strikes)

    @property
    def run_dir(self) -> Path:
        return Path(self.log_dir or self.save or "runs/pretrain")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _arg_type(tp):
    """`int | None` -> int; used to convert flag strings."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


def build_parser(prog: str = "protdp train") -> argparse.ArgumentParser:
    """argparse parser generated from `TrainArgs` (defaults suppressed so YAML can sit between)."""
    parser = argparse.ArgumentParser(
        prog=prog, argument_default=argparse.SUPPRESS,
        description="Pretrain an Evoformer-style model data-parallel (Megatron-style flags).")
    parser.add_argument("--config", help="YAML with any of these options (flags override it)")
    hints = typing.get_type_hints(TrainArgs)
    for f in dataclasses.fields(TrainArgs):
        flag = "--" + f.name.replace("_", "-")
        tp = _arg_type(hints[f.name])
        helptext = f"{f.metadata['help']} (default: {f.default})"
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=helptext)
        else:
            parser.add_argument(flag, type=tp, help=helptext, metavar=f.name.upper())
    return parser


def parse_args(argv: list[str], prog: str = "protdp train") -> TrainArgs:
    """Flags (and an optional YAML) -> validated `TrainArgs`. Raises ConfigError on bad values."""
    parser = build_parser(prog)
    ns = vars(parser.parse_args(argv))
    merged: dict = {}
    config_path = ns.pop("config", None)
    if config_path is not None:
        merged.update({k.replace("-", "_"): v for k, v in  # packaged configs from any folder
                       read_yaml(resolve_config(config_path, "train")).items()})
    merged.update(ns)
    return from_dict(TrainArgs, merged, source=config_path or "flags")

