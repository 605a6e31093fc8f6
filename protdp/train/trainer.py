"""The pretraining loop: micro-batches with gradient accumulation over a data-parallel engine.

Megatron's `pretrain()` / `train_step()` structure on AF2's recipe (supplement 1.11):
per optimizer step every rank runs `num_micro_batches` forward/backward passes (all but the
last under `no_sync()`), `finish_grad_sync()` completes the bucketed reduction, the (possibly
distributed) AdamW steps with a per-step lr (linear warmup, then decay) and global-norm
clipping, and an EMA of the weights (0.999) is updated; the EMA is what validation uses.
Number of recycles, feature sampling and crops come from seeds derived from
(seed, iteration, micro-batch[, rank]) so that every rank makes the same graph-shaping choice
for a step and a resumed run replays exactly; dropout uses the per-rank torch RNG, which is
checkpointed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from protdp.errors import ConfigError
from protdp.model.attention import resolved_backend
from protdp.model.compile import compile_evoformer_blocks
from protdp.parallel import init_distributed
from protdp.parallel import load_checkpoint as engine_load
from protdp.parallel import save_checkpoint as engine_save
from protdp.resources import resolve_config
from protdp.train import checkpointing
from protdp.train.args import TrainArgs
from protdp.train.ema import EMA
from protdp.train.logging import PHASES, RunLogger, StepTimer, max_memory_mb
from protdp.train.release_jobs import RELEASE_LOG, ReleaseChecks
from protdp.train.release_record import read_release
from protdp.train.schedule import lr_for_args
from protdp.train.sources import DISTILLATION, PDB, Source, pick_source
from protdp.train.summary import format_summary, summarize

DEFAULT_MODEL_CONFIG = "configs/model/small.yaml"


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (numpy SeedSequence: well mixed, platform independent)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0] >> 1)


def split_families(ids: list[str], args: TrainArgs) -> tuple[list[str], list[str]]:
    """(train, validation) family ids; held-out ids chosen by a seeded permutation, or named."""
    ids = sorted(ids)
    if args.val_families:
        val = [v.strip() for v in args.val_families.split(",") if v.strip()]
        unknown = sorted(set(val) - set(ids))
        if unknown:
            raise ConfigError(f"--val-families: {unknown} not in the store")
    elif args.val_fraction > 0:
        n_val = max(1, round(args.val_fraction * len(ids)))
        perm = np.random.default_rng(args.seed).permutation(len(ids))
        val = [ids[i] for i in sorted(perm[:n_val])]
    else:
        val = []
    train = [i for i in ids if i not in set(val)]
    if not train:
        raise ConfigError(f"no training families left after holding out {len(val)} for validation")
    return train, sorted(val)


def _collective(op: str, fn, rank: int):
    """The trainer's own collectives with the engine's error naming (timeouts never hang silently)."""
    from protdp.parallel.collectives import run

    return run(op, fn, rank)


class Trainer:
    """Model, engine, optimizer, data and logger built from `TrainArgs`; `train()` runs the loop."""

    def __init__(self, args: TrainArgs):
        from protdp.data.features import collate, featurize
        from protdp.model import build_model
        from protdp.model.losses import compute_loss
        from protdp.model.axial import dap_sharded_parameters
        from protdp.parallel import DataParallel, DistributedOptimizer

        self.featurize, self.collate, self.compute_loss = featurize, collate, compute_loss
        if not args.data:
            raise ConfigError("--data: an HDF5 store is required (build one with `protdp data build`)")
        self.store = self._open_store(args)  # fail fast on a missing store, before any rendezvous
        launch = init_distributed(timeout=args.distributed_timeout_minutes * 60.0)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.launcher = launch.launcher
        self.args = args = args.check_world(self.world)
        self._build_groups(args)
        self.num_micro = args.num_micro_batches
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.device = (torch.device("cuda", launch.local_rank) if torch.cuda.is_available()
                       else torch.device("cpu"))

        self.train_ids, self.val_ids = split_families(list(self.store.family_ids), args)

        torch.manual_seed(args.seed)  # identical init everywhere (DataParallel broadcasts too)
        model, self.finetune_source = self._build_model(build_model)
        if self.device.type != "cpu":
            model.to(self.device)
        if args.compile:
            compile_evoformer_blocks(model)
        self.model_config = model.config
        self._setup_featurizer(model)
        self.pcfg = args.parallel_config()
        self._engine_save, self._engine_load = engine_save, engine_load
        if args.engine == "deepspeed":  # DeepSpeed's ZeRO engine behind the same calls
            from protdp.train import deepspeed_engine

            self.ddp, self.opt = deepspeed_engine.build(model, args, self.world)
            self._engine_save, self._engine_load = deepspeed_engine.save, deepspeed_engine.load
        else:
            model.set_axial_comm(self.groups.axial_comm())
            self.ddp = DataParallel(model, self.pcfg, process_group=self.groups.dp_group,
                                    dap_params=dap_sharded_parameters(model),
                                    dap_group=self.groups.dap_group)
            self.ddp.broadcast_params()
            self.opt = DistributedOptimizer(
                self.ddp, self.pcfg, lr=args.lr, weight_decay=args.weight_decay,
                betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
                clip_grad=args.clip_grad)  # 0 disables clipping
        self.model = self.ddp.module
        self.ema = EMA(self.model, args.ema_decay)
        # per-rank streams (dropout); graph-shaping choices use derive_seed(seed, iteration, ...)
        self._seed_rank_streams(args.seed, self.dp_rank)

        self._build_sources(args)
        self.iteration = 0
        self._quarantine_records: list[dict] = []   # a resumed run's, from the checkpoint
        self.resumed_from: str | None = None
        self._resume()
        self.feed = self._build_feed()  # after resume: the samplers are at the saved position
        self.logger = RunLogger(
            args.run_dir, rank=self.rank, config={**args.to_dict(), "world_size": self.world,
                                                  "finetune_source": self.finetune_source},
            start_iter=self.iteration, train_iters=args.train_iters, log_interval=args.log_interval,
            wandb_mode=args.wandb_mode, wandb_project=args.wandb_project, wandb_name=args.wandb_exp_name,
            progress_bar=args.progress_bar)
        self.timer = StepTimer(self.device)
        self.records: list[dict] = []
        self.last_val: dict | None = None
        # rank 0's background release checks, one at a time (protdp.train.release_jobs)
        self.release_checks = (ReleaseChecks(log=self.logger.print)
                               if self.rank == 0 and args.release_check else None)

    # ------------------------------------------------------------------ set-up helpers
    def _build_sources(self, args) -> None:
        """This rank's samplers of the training store and of --distillation-data."""
        from protdp.data.sampler import FamilySampler
        from protdp.data.store import FamilyStore

        self.sampler = FamilySampler(
            {f: self.store.length(f) for f in self.train_ids}, world_size=self.dp_size, rank=self.dp_rank,
            micro_batch_size=args.micro_batch_size, seed=args.seed, crop_size=args.crop_size)
        self.sources = {PDB: Source(PDB, self.store, self.sampler)}
        if args.distillation_data:
            dstore = FamilyStore(args.distillation_data)
            self.sources[DISTILLATION] = Source(DISTILLATION, dstore, FamilySampler(
                {f: dstore.length(f) for f in dstore.family_ids}, world_size=self.dp_size,
                rank=self.dp_rank, micro_batch_size=args.micro_batch_size, seed=args.seed + 1,
                crop_size=args.crop_size), args.distillation_loss_weight)

    def _open_store(self, args):
        """The training corpus of --data (protdp.train.complex opens a complex store)."""
        from protdp.data.store import FamilyStore

        return FamilyStore(args.data)

    def _setup_featurizer(self, model) -> None:
        if model.config.templates:   # stored template hits, sampled as AF2 trains (issue 31)
            from protdp.templates.training import collate_templates, with_templates
            self.featurize = with_templates(self.featurize, model.config.max_templates)
            self.collate = collate_templates(self.collate)

    def _build_model(self, build_model) -> tuple[torch.nn.Module, dict | None]:
        """The model of --model-config, or of the --finetune-from checkpoint with its weights
        (EMA when saved): only the weights; optimizer, schedule and EMA start fresh."""
        args = self.args
        if args.finetune_from is None:
            return build_model(resolve_config(args.model_config or DEFAULT_MODEL_CONFIG, "model"),
                               verbose=self.rank == 0), None
        trained = checkpointing.read_any_weights(args.finetune_from)
        state, weights = checkpointing.merged_weights(trained)
        config = (resolve_config(args.model_config, "model") if args.model_config
                  else trained.model_config)
        model = build_model(config, verbose=self.rank == 0)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ConfigError(f"--finetune-from {args.finetune_from}: the weights do not fit the "
                              f"model config: {str(exc).splitlines()[0]}") from None
        source = {"path": str(trained.path), "sha256": trained.sha256, "kind": trained.kind,
                  "weights": weights}
        self._print(f"fine-tuning from {trained.path} ({trained.kind}, {weights} weights)")
        return model, source

    def _build_groups(self, args) -> None:
        """World = DP x DAP (`protdp.parallel.groups`): the engine, sampler and per-rank seeds
        use the DP index, so every rank of a DAP group reads the same sample and draws the same
        dropout masks."""
        from protdp.parallel.groups import build_groups

        if args.dap_size > 1 and args.engine == "deepspeed":
            raise ConfigError("--dap-size > 1 runs on protdp's engine only (--engine protdp)")
        self.groups = build_groups(args.dap_size)
        self.dp_rank, self.dp_size = self.groups.dp_rank, self.groups.dp_size
        self.dap_size = args.dap_size
        self._dap_text = f" x dap={self.dap_size}" if self.dap_size > 1 else ""

    @staticmethod
    def _seed_rank_streams(seed: int, rank: int) -> None:
        torch.manual_seed(derive_seed(seed, 1, rank))
        random.seed(derive_seed(seed, 2, rank))
        np.random.seed(derive_seed(seed, 3, rank))

    def _print(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def _resume(self) -> None:
        """Load the latest checkpoint of --load (or of --save after an elastic restart)."""
        args = self.args
        load_dir = args.load or (args.save if self.restart_count > 0 else None)
        if load_dir is None:
            return
        path = checkpointing.latest_checkpoint(load_dir)
        if path is None:
            self._print(f"no checkpoint in {load_dir}: starting from scratch")
            return
        ck = checkpointing.load_checkpoint(path, self.rank)
        # model + optimizer shards, resharded to this run's dp size by the engine
        self._engine_load(path / checkpointing.ENGINE, self.ddp, self.opt)
        self.ema.load_state_dict(ck.ema_state)
        same_world = (ck.saved_world_size == self.world   # same ranks, same DAP groups
                      and int(ck.meta["config"].get("dap_size", 1)) == self.dap_size)
        states = (ck.rank_state if same_world else checkpointing.load_checkpoint(path, 0).rank_state)
        for name, source in self.sources.items():
            key = "sampler" if name == PDB else f"{name}_sampler"
            if key not in states:
                raise ConfigError(f"{path} has no {name} sampler state: resume with the corpora "
                                  "the run was started with (--distillation-data)")
            source.sampler.load_state_dict(states[key])
        if same_world:
            checkpointing.set_rng_state(ck.rank_state["rng"])
            self._quarantine_records = checkpointing.quarantine_records(ck.rank_state)
        else:  # resharded: ranks are new, derive their streams from (seed, iteration, rank)
            self._seed_rank_streams(derive_seed(args.seed, ck.iteration), self.dp_rank)
        self.iteration = ck.iteration
        self.resumed_from = str(path)
        self._print(f"resumed from {path} at iteration {ck.iteration} (saved with dp="
                    f"{ck.saved_world_size}, now dp={self.dp_size}{self._dap_text}; "
                    f"restart #{self.restart_count})")

    # ------------------------------------------------------------------ data
    def _build_feed(self):
        """Training micro-batches off the training thread (`protdp.train.feed`), each the
        same as `_batch(fids, seed)` would build it."""
        from protdp.train.feed import BatchFeed, default_workers

        args, cfg = self.args, self.model_config
        workers = default_workers() if args.data_workers is None else args.data_workers
        kwargs = {"crop_size": args.crop_size, "max_msa_rows": args.max_msa_rows, "training": True,
                  "msa_samples": cfg.max_recycles + 1,
                  "max_extra_msa_rows": args.max_extra_msa_rows if cfg.extra_msa else 0}
        return BatchFeed(
            sources=self.sources, seed_of=lambda it, micro: derive_seed(args.seed, it, micro, self.dp_rank),
            source_of=lambda seed: self.sources[pick_source(derive_seed(seed, 11), args.distillation_fraction,
                                                            DISTILLATION in self.sources)],
            example_seed=derive_seed, kwargs=kwargs, start_iteration=self.iteration,
            num_micro=self.num_micro, device=self.device, workers=workers, timeout=args.data_timeout,
            prefetch_depth=max(2, 2 * workers) if args.prefetch_depth is None else args.prefetch_depth,
            max_templates=cfg.max_templates if cfg.templates else 0,
            deadline=args.deadline_policy() if self.dap_size == 1 else None, rank=self.rank,
            quarantine_records=self._quarantine_records, run_dir=args.run_dir)

    def _batch(self, fids: list[str], seed: int, training: bool = True, store=None) -> dict:
        """Features of `fids`: one MSA sample per recycling pass (AF2 resample_msa_in_recycling;
        the sampled number of recycles decides how many the model reads); `store`: the
        corpus they come from (default the training store)."""
        cfg = self.model_config
        passes = (cfg.max_recycles if training else cfg.num_recycles) + 1
        store = store if store is not None else self.store
        examples = [self.featurize(store.read(f), crop_size=self.args.crop_size,
                                   max_msa_rows=self.args.max_msa_rows, seed=derive_seed(seed, k),
                                   training=training, msa_samples=passes,
                                   max_extra_msa_rows=self.args.max_extra_msa_rows if cfg.extra_msa
                                   else 0) for k, f in enumerate(fids)]
        batch = self.collate(examples)
        return {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}

    # ------------------------------------------------------------------ model outputs
    @staticmethod
    def _pred_ca(outputs: dict) -> torch.Tensor:
        return outputs["final_atom_positions"][..., 1, :]  # [B, L, 3]

    @staticmethod
    def _plddt(outputs: dict) -> torch.Tensor:
        return outputs["plddt"]  # [B, L] in 0..100

    @staticmethod
    def _true_ca(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        mask = batch["backbone_mask"][..., 1] * batch["seq_mask"]  # [B, L]
        return batch["backbone_positions"][..., 1, :], mask  # [B, L, 3]

    def _recycle_generator(self, *parts: int) -> torch.Generator:
        """Seeded identically on every DP rank: all ranks run the same number of recycles."""
        return torch.Generator().manual_seed(derive_seed(self.args.seed, 0x5EC, *parts))

    # ------------------------------------------------------------------ one optimizer step
    def train_step(self) -> dict:
        from protdp.metrics import lddt_ca_tensor

        args, it, timer = self.args, self.iteration, self.timer
        lr = lr_for_args(it, args)
        self.opt.set_lr(lr)
        timer.reset()
        self.ddp.zero_grad_buffer()
        loss_sum, term_sums = 0.0, {}
        lddt_sum, lddt_n, samples, residues = 0.0, 0, 0, 0
        per_source = dict.fromkeys(self.sources, 0)
        for micro in range(self.num_micro):
            with timer.phase("data_wait"):   # the prefetched micro-batch (protdp.train.feed)
                source, fids, batch = self.feed.next(it, micro)
                per_source[source.name] += len(fids)
            last = micro == self.num_micro - 1
            with (contextlib.nullcontext() if last else self.ddp.no_sync()):
                with timer.phase("forward"):
                    outputs = self.ddp(batch, recycle_generator=self._recycle_generator(it, micro))
                    total, terms = self._loss_or_poison(outputs, batch, it)
                    total = total * source.loss_weight
                with timer.phase("backward"):
                    if args.engine == "deepspeed":
                        self.ddp.backward(total)  # DeepSpeed divides by the accumulation
                    else:
                        (total / self.num_micro).backward()
            loss_sum += float(total.detach())
            for k, v in terms.items():
                term_sums[k] = term_sums.get(k, 0.0) + float(v.detach())
            with torch.no_grad():
                true_ca, mask = self._true_ca(batch)
                ld = lddt_ca_tensor(self._pred_ca(outputs).detach().float(), true_ca, mask)  # [B]
            lddt_sum += float(ld.sum())
            lddt_n += ld.numel()
            samples += len(fids)
            residues += int(batch["seq_mask"].sum())
        with timer.phase("exposed_comm"):
            self.ddp.finish_grad_sync()
        with timer.phase("optimizer"):
            stepped = self.opt.step()
            if self.pcfg.overlap_param_gather:
                self.ddp.finish_param_sync()  # the EMA needs the updated full weights now
            if stepped:  # a skipped (non-finite) step leaves weights and their average alone
                self.ema.update(self.model)
        step_time = timer.total()
        self.iteration += 1

        # one SUM and one MAX all-reduce of a few scalars: global means, rank-mean phase times
        # (they add up to the rank-mean step time) and the slowest rank's step time and memory
        keys = self._term_keys
        phase = [timer.times[p] for p in PHASES] + [step_time]
        sums = torch.tensor([loss_sum, lddt_sum, lddt_n, samples, residues] + phase
                            + [term_sums.get(k, float("nan")) for k in keys]
                            + [per_source[k] for k in self.sources]
                            + self._quarantine_counts(it), dtype=torch.float64)
        maxes = torch.tensor([step_time, max_memory_mb(self.device), self.ddp.last_grad_sync.get("comm_s", 0.0),
                              timer.times["data_wait"]], dtype=torch.float64)
        self._all_reduce_step(sums, maxes)
        n_micro_global = self.num_micro * self.world
        n_phase = 5 + len(phase)
        rec = {"iteration": self.iteration, "lr": lr, "loss": sums[0].item() / n_micro_global,
               "train_lddt_ca": sums[1].item() / max(1.0, sums[2].item()),
               "samples": int(sums[3]) // self.dap_size, "residues": int(sums[4]) // self.dap_size,
               "grad_norm": self._grad_norm(), "skipped": not stepped,
               **{f"loss/{k}": sums[n_phase + i].item() / n_micro_global for i, k in enumerate(keys)},
               **{f"time/{p}": sums[5 + i].item() / self.world for i, p in enumerate(PHASES)},
               "time/step_mean": sums[5 + len(PHASES)].item() / self.world,
               "time/step": maxes[0].item(), "max_memory_mb": maxes[1].item(),
               "comm/grad_sync_busy_s": maxes[2].item(), "restart": self.restart_count,
               "attention_kernel": resolved_backend(getattr(self.model_config, "trunk",  # multimer
                                                            self.model_config).attention_backend,
                                                    self.device, bias_grad=True),
               **{f"samples/{k}": int(sums[n_phase + len(keys) + i]) // self.dap_size
                  for i, k in enumerate(self.sources)},
               "time/data_wait_max": maxes[3].item(),   # the slowest rank's (issue 44)
               "quarantine/step": int(sums[-2]), "quarantine/total": int(sums[-1])}
        rec.update(samples_per_s=rec["samples"] / rec["time/step"],
                   residues_per_s=rec["residues"] / rec["time/step"])
        return rec

    def _all_reduce_step(self, sums: torch.Tensor, maxes: torch.Tensor) -> None:
        """The step's two collectives, on every rank every step: SUM of `sums`, MAX of `maxes`."""
        if self.world > 1:
            _collective("all_reduce(step metrics)", lambda: dist.all_reduce(sums), self.rank)
            _collective("all_reduce(step maxima)", lambda: dist.all_reduce(maxes, op=dist.ReduceOp.MAX),
                        self.rank)

    def _quarantine_counts(self, iteration: int) -> list[int]:
        """[families this rank set aside in `iteration`, in the run so far] (tolerant feed)."""
        feed = self.feed
        if not hasattr(feed, "quarantined_at"):
            return [0, 0]
        return [feed.quarantined_at(iteration), len(feed.quarantine_records())]

    @property
    def _term_keys(self) -> list[str]:
        """Loss terms in a fixed order, identical on every rank (the metrics all-reduce needs it)."""
        keys = ["aux", "backbone_fape", "distogram", "fape", "masked_msa", "plddt", "torsion"]
        keys += ["pae"] if self.model_config.pae_head else []
        keys += ["experimentally_resolved"] if hasattr(self.model, "experimentally_resolved_head") \
            else []
        return keys + (["violation"] if self.model_config.loss.violation_weight > 0 else [])

    def _loss_or_poison(self, outputs: dict, batch: dict, iteration: int):
        """The loss; on non-finite activations (a diverging model) a NaN loss over every
        parameter instead, so this rank still runs the same backward and collectives and the
        optimizer's all-reduced non-finite vote skips the step on every rank (no rank leaves)."""
        from protdp.model.losses import NonFiniteError

        try:
            return self.compute_loss(outputs, batch, self.model_config)
        except NonFiniteError as exc:
            print(f"rank {self.rank} iter {iteration}: {exc}; voting to skip the step",
                  file=sys.stderr, flush=True)
            poison = sum(p.sum() for p in self.ddp.module.parameters()) * float("nan")
            return poison, {k: poison.detach() for k in self._term_keys}

    def _grad_norm(self):
        g = getattr(self.opt, "last_grad_norm", None)
        return None if g is None else float(g)

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def evaluate(self) -> dict | None:
        """EMA weights on held-out families: lDDT-Cα and Spearman(pLDDT, per-residue true lDDT)."""
        from scipy.stats import spearmanr

        from protdp.metrics import lddt_ca_tensor

        if not self.val_ids or self.args.eval_iters == 0:
            return None
        mine = self.val_ids[self.dp_rank::self.dp_size][: self.args.eval_iters]
        rows = []  # (family, lddt, val loss, plddt [n], true per-residue lddt [n])
        self.model.eval()
        try:
            with self.ema.swapped_into(self.model):
                for fid in mine:
                    batch = self._batch([fid], derive_seed(self.args.seed, 0xE7A1), training=False)
                    outputs = self.model(batch)
                    total, _ = self.compute_loss(outputs, batch, self.model_config)
                    true_ca, mask = self._true_ca(batch)
                    pred_ca = self._pred_ca(outputs).float()
                    g = float(lddt_ca_tensor(pred_ca, true_ca, mask)[0])
                    per_res = lddt_ca_tensor(pred_ca, true_ca, mask, per_residue=True)[0]
                    keep = mask[0] > 0
                    rows.append((fid, g, float(total), self._plddt(outputs)[0][keep].tolist(),
                                 per_res[keep].tolist()))
        finally:
            self.model.train()
        gathered = [None] * self.world
        _collective("all_gather_object(validation)", lambda: dist.all_gather_object(gathered, rows),
                    self.rank)
        rows = [r for q, part in enumerate(gathered) for r in part
                if q % self.dap_size == 0]   # one copy per DAP group
        plddt = [x for r in rows for x in r[3]]
        true = [x for r in rows for x in r[4]]
        defined = len(plddt) > 2 and len(set(plddt)) > 1 and len(set(true)) > 1   # else n/a,
        rho = spearmanr(plddt, true).statistic if defined else float("nan")     # no scipy warning
        rec = {"iteration": self.iteration, "val_families": len(rows),
               "val_lddt_ca": float(np.mean([r[1] for r in rows])),
               "val_loss": float(np.mean([r[2] for r in rows])),
               "val_plddt_spearman": None if not math.isfinite(rho) else float(rho),
               "val_plddt_mean": float(np.mean(plddt)) if plddt else None}
        rec.update({f"val_lddt_ca/{r[0]}": r[1] for r in rows})
        return rec

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        if self.pcfg.overlap_param_gather:
            self.ddp.finish_param_sync()
        saver = checkpointing.Saver(
            rank=self.rank, world_size=self.world, keep_last=self.args.keep_last,
            in_use=self.release_checks.in_use if self.release_checks is not None else set,
            barrier=lambda: _collective("barrier(checkpoint)", dist.barrier, self.rank),
            save_engine=lambda p: self._engine_save(p, self.ddp, self.opt))
        path = checkpointing.save_checkpoint(
            saver, self.args.save, self.iteration, ema_state=self.ema.state_dict(),
            rank_state={"iteration": self.iteration, **{   # as consumed, not as prefetched
                ("sampler" if name == PDB else f"{name}_sampler"): state
                for name, state in self.feed.sampler_states().items()},
                **checkpointing.quarantine_state(getattr(self.feed, "quarantine_records", list)())},
            config={**self.args.to_dict(), "model": dataclasses.asdict(self.model_config),
                    "finetune_source": self.finetune_source})
        self.logger.print(f"saved checkpoint {path}")
        served = self.write_servable(path)
        if self.release_checks is not None:
            self.release_checks.submit(served)

    def write_servable(self, saved: Path) -> Path:
        """Hook after each save: write what serves predictions and return the folder that
        `protdp release` checks (a monomer run: the iteration folder just saved)."""
        return saved

    def servable_digest(self, served: Path) -> str:
        """The sha256 a release record of `served` binds (the checkpoint's weight files)."""
        return checkpointing.checkpoint_digest(served)

    def _wait_for_release_checks(self) -> None:
        """The last checkpoint's release check decides whether it may serve predictions: wait
        for the running check, then for the final checkpoint's."""
        checks = self.release_checks
        if checks is None or not checks.launched:
            return
        final = checks.waiting or checks.launched[-1]
        self.logger.print(f"waiting for the release check of {final} (log: {final / RELEASE_LOG})")
        job = checks.finish()
        status = read_release(job.path, self.servable_digest(job.path))
        verdict = "released" if status.released else f"not released: {status.reason}"
        self.logger.print(f"release check of {job.path}: {verdict}")

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict:
        args = self.args
        self.logger.print(
            f"pretraining: dp={self.dp_size}{self._dap_text} ({self.launcher}), micro={args.micro_batch_size}, "
            f"global={args.global_batch_size}, accumulation={self.num_micro}, "
            f"overlap_grad_reduce={args.overlap_grad_reduce}, distributed_optimizer="
            f"{args.use_distributed_optimizer}, engine={args.engine}; {len(self.train_ids)} train / {len(self.val_ids)} val "
            f"families; iterations {self.iteration} -> {args.train_iters}")
        saved_at = self.iteration
        try:
            while self.iteration < args.train_iters:
                rec = self.train_step()
                self.records.append(rec)
                if self.release_checks is not None:
                    self.release_checks.poll()      # start a waiting check once one has ended
                self.logger.step(rec)
                if self.iteration % args.eval_interval == 0 and self.iteration < args.train_iters:
                    self._eval_and_log()
                if args.save and args.save_interval and self.iteration % args.save_interval == 0:
                    self.save()
                    saved_at = self.iteration
            self._eval_and_log()
            if args.save and saved_at != self.iteration:
                self.save()
            self._wait_for_release_checks()
            summary = summarize(self.records, self.last_val, self.iteration)
            summary["restart"] = self.restart_count
            self.logger.print(format_summary(summary))
            if self.rank == 0:
                (args.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
            return summary
        finally:
            self.feed.close()
            self.logger.close()

    def _eval_and_log(self) -> None:
        val = self.evaluate()
        if val is not None:
            self.last_val = val
            self.logger.eval(val)
