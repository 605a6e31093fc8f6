"""The input pipeline (protdp.data.pipeline, protdp.train.feed): compact host examples expand
to exactly `featurize`'s tensors; the worker pool returns results in submission order whatever
the number of workers or their timing; a dead, hung or failing worker is a clear error naming
the families; the feed gives the same batches with and without workers and checkpoints the sampler
as consumed, so a resumed feed continues exactly."""

from __future__ import annotations

import json
import runpy
import sys
import time

import numpy as np
import pytest
import torch

from data_fixtures import build_pairs_store
from pipeline_workers import describe, slow_square
from protdp.data.features import collate, featurize
from protdp.data.pipeline.compact import compact_example, nbytes
from protdp.data.pipeline.expand import expand_batch, expand_example
from protdp.data.pipeline.pool import OrderedPool, WorkerError
from protdp.data.residues import GAP_ID
from protdp.data.sampler import FamilySampler
from protdp.data.store import FamilyStore
from protdp.errors import InputError
from protdp.paths import REPO_ROOT
from protdp.train.feed import BatchFeed
from protdp.train.sources import PDB, Source


def assert_same(a: dict, b: dict) -> None:
    assert set(a) == set(b), set(a) ^ set(b)
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            w = b[k]
            assert v.dtype == w.dtype and v.shape == w.shape, (k, v.dtype, w.dtype, v.shape, w.shape)
            assert torch.equal(v.isnan(), w.isnan()) and torch.equal(v.nan_to_num(), w.nan_to_num()), k
        else:
            assert v == b[k], k


def synthetic_family(rows: int, length: int, seed: int) -> dict:
    """Query-derived rows (20-90 % identity), gaps and deletions, as in a real MSA."""
    rng = np.random.default_rng(seed)
    query = rng.integers(0, 20, length)
    same = rng.random((rows, length)) < rng.uniform(0.2, 0.9, (rows, 1))
    msa = np.where(same, query[None], rng.integers(0, 21, (rows, length)))
    msa[1:][rng.random((rows - 1, length)) < 0.15] = GAP_ID
    msa[0] = query
    dels = (rng.random((rows, length)) < 0.05) * rng.integers(1, 300, (rows, length))
    return {"msa": msa.astype(np.uint8), "deletion_matrix": np.minimum(dels, 255).astype(np.uint8),
            "residue_index": np.arange(length, dtype=np.int32),
            "all_atom_positions": rng.normal(size=(length, 37, 3)).astype(np.float32),
            "all_atom_mask": np.ones((length, 37), np.uint8),
            "between_segment_residues": np.zeros(length, np.uint8), "family_id": f"syn{seed}"}


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir) -> FamilyStore:
    ids = {"2q2k_A", "5awl_A", "102m_A", "T1055"}
    return FamilyStore(build_pairs_store(data_dir, ids, tmp_path_factory.mktemp("pipe"),
                                         {"msa/4hhb_B.colabfold.a3m"}))


@pytest.mark.parametrize("kw", [
    dict(crop_size=48, max_msa_rows=16, msa_samples=3, max_extra_msa_rows=40),
    dict(crop_size=None, max_msa_rows=400, training=False),                 # no extra rows
    dict(crop_size=30, max_msa_rows=8, msa_samples=1, max_extra_msa_rows=0),
    dict(crop_size=64, max_msa_rows=32, msa_samples=2, max_extra_msa_rows=1000,
         masked_msa_fraction=0.3)])
def test_compact_expands_to_exactly_featurize(kw):
    fam = synthetic_family(300, 80, 5)
    for seed in (0, 17):
        full = featurize(fam, seed=seed, **kw)
        compact = compact_example(fam, seed=seed, **kw)
        assert_same(full, expand_example(compact))


def test_compact_example_is_a_fraction_of_the_featurized_bytes():
    kw = dict(crop_size=96, max_msa_rows=64, max_extra_msa_rows=256, msa_samples=4)
    fam = synthetic_family(1000, 128, 1)
    full, compact = featurize(fam, seed=0, **kw), compact_example(fam, seed=0, **kw)
    assert nbytes(compact) * 5 < nbytes(full), (nbytes(compact), nbytes(full))


def test_compact_batch_of_real_families_equals_collate(store):
    kw = dict(crop_size=64, max_msa_rows=8, max_extra_msa_rows=64, msa_samples=2)
    fams = [store.read(f) for f in store.family_ids]
    expected = collate([featurize(f, seed=i, **kw) for i, f in enumerate(fams)])
    assert_same(expected, expand_batch([compact_example(f, seed=i, **kw)
                                        for i, f in enumerate(fams)]))


def _run_pool(workers: int, n: int, jitter: float) -> list[dict]:
    with OrderedPool(slow_square, workers, timeout=30, describe=describe) as pool:
        out = []
        for i in range(n):                    # keep 3 ahead, like the feed
            pool.submit({"i": i, "fids": [f"f{i}"], "jitter": jitter})
            if pool.outstanding > 3:
                out.append(pool.get())
        while pool.outstanding:
            out.append(pool.get())
    return out


def test_pool_order_is_independent_of_workers_and_timing():
    two = _run_pool(2, 12, 0.05)               # random delays: workers finish out of order
    assert [r["index"] for r in two] == list(range(12))
    assert [r["value"] for r in two] == [slow_square({"i": i})["value"] for i in range(12)]
    assert len({r["pid"] for r in two}) == 2          # both workers took tasks


def test_pool_dead_hung_and_failing_workers_are_clear_errors():
    with OrderedPool(slow_square, 1, timeout=30, describe=describe) as pool:
        pool.submit({"i": 0, "fids": ["ok"]})
        pool.submit({"i": 1, "fids": ["broken_family"], "action": "bad"})
        pool.submit({"i": 2, "fids": ["after"]})
        assert pool.get()["value"] == 0
        with pytest.raises(InputError, match="bad family"):   # raised as the worker raised it
            pool.get()
        assert pool.get()["value"] == 4                        # the pool goes on
        pool.submit({"i": 3, "fids": ["fam_that_kills"], "action": "die"})
        with pytest.raises(WorkerError, match=r"died with exit code 3 while building families "
                                              r"fam_that_kills"):
            pool.get()
    t0 = time.monotonic()
    with OrderedPool(slow_square, 1, timeout=1.5, describe=describe) as pool:
        pool.submit({"i": 0, "fids": ["fine"]})
        assert pool.get()["value"] == 0
        pool.submit({"i": 1, "fids": ["fam_that_hangs"], "action": "hang"})
        with pytest.raises(WorkerError, match=r"no progress for 1.5 s while building families "
                                              r"fam_that_hangs"):
            pool.get()
    assert time.monotonic() - t0 < 20


def test_ready_thread_keeps_order_reraises_and_shuts_down_cleanly():
    """The trainer-side ready thread (pipeline.ready) gives the pool's results in order, each
    prepared; a task's error and a dead worker reach the training thread as the pool raises
    them; closing while it waits on a busy worker returns promptly."""
    from protdp.data.pipeline.ready import ReadyThread, touch_pages

    seen = []
    with OrderedPool(slow_square, 2, timeout=30, describe=describe) as pool:
        ready = ReadyThread(pool, lambda r: {**r, "prepared": True})
        for i in range(6):
            pool.submit({"i": i, "fids": [f"f{i}"], "jitter": 0.05})
            ready.expect()
        pool.submit({"i": 6, "fids": ["broken_family"], "action": "bad"})
        ready.expect()
        for i in range(6):
            r = ready.get()
            seen.append(r["index"])
            assert r["prepared"] and r["value"] == i ** 2
            ready.release(r)
        with pytest.raises(InputError, match="bad family"):
            ready.get()
        pool.submit({"i": 7, "fids": ["fam_that_kills"], "action": "die"})
        ready.expect()
        with pytest.raises(WorkerError, match="died with exit code 3 while building families "
                                              "fam_that_kills"):
            ready.get()
        ready.close()
    assert seen == list(range(6))
    t0 = time.monotonic()
    pool = OrderedPool(slow_square, 1, timeout=60, describe=describe)
    ready = ReadyThread(pool, touch_pages)
    pool.submit({"i": 0, "fids": ["fam_that_hangs"], "action": "hang"})
    ready.expect()
    ready.stop()
    pool.close()
    ready.close()
    assert not ready._thread.is_alive() and time.monotonic() - t0 < 15
    batch = {"a": torch.arange(5000, dtype=torch.float32), "b": [np.ones(3000)], "c": "x"}
    assert touch_pages(batch) is batch


def _feed(store, workers: int, states=None, start: int = 0) -> BatchFeed:
    sampler = FamilySampler(store, 1, 0, 2, seed=3, crop_size=64)
    if states is not None:
        sampler.load_state_dict(states[PDB])
    sources = {PDB: Source(PDB, store, sampler)}
    return BatchFeed(sources=sources, seed_of=lambda it, m: 1000 * it + m,
                     source_of=lambda seed: sources[PDB], example_seed=lambda s, k: s + 7 * k,
                     kwargs=dict(crop_size=64, max_msa_rows=8, max_extra_msa_rows=32,
                                 msa_samples=2, training=True),
                     start_iteration=start, num_micro=2, device=torch.device("cpu"),
                     workers=workers, prefetch_depth=3, timeout=60)


def test_feed_same_batches_with_workers_and_exact_resume(store):
    steps = [(it, m) for it in range(3) for m in range(2)]      # 6 micro-batches, > one epoch
    sync, pooled = _feed(store, 0), _feed(store, 1)
    try:
        states_at = {}
        for it, m in steps:
            _, fids_a, a = sync.next(it, m)
            _, fids_b, b = pooled.next(it, m)
            assert fids_a == fids_b
            assert_same(a, b)
            states_at[(it, m)] = pooled.sampler_states()
            assert states_at[(it, m)] == sync.sampler_states()  # as consumed, not prefetched
        with pytest.raises(RuntimeError, match="out of step"):
            sync.next(5, 0)
    finally:
        pooled.close()
    # a feed resumed from the state after iteration 1 continues exactly like the first run
    resumed, fresh = _feed(store, 0, states_at[(1, 1)], start=2), _feed(store, 0)
    for it, m in steps:
        _, fids, batch = fresh.next(it, m)
        if it >= 2:
            _, fids_r, batch_r = resumed.next(it, m)
            assert fids_r == fids
            assert_same(batch, batch_r)


def test_gpu_check_script_runs_on_cpu(tmp_path, monkeypatch):
    """benchmarks/loader_gpu_check.py, the device check prepared for a GPU, run in-process."""
    out = tmp_path / "check.json"
    monkeypatch.setattr(sys, "argv", ["loader_gpu_check.py", "--device", "cpu", "--rows", "300",
                                      "--length", "64", "--crop", "48", "--clusters", "16",
                                      "--extra", "32", "--out", str(out)])
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = runpy.run_path(str(REPO_ROOT / "benchmarks/loader_gpu_check.py"))
    assert script["main"]() == 0
    assert json.loads(out.read_text())["equal_to_featurize"] is True


class _DictStore:
    def __init__(self, families: dict):
        self.families = families

    def read(self, fid: str) -> dict:
        return self.families[fid]


@pytest.mark.parametrize("ship_compact", [False, True])
def test_template_batches_are_compact_examples_equal_to_featurize(ship_compact):
    """A template model's worker ships its template features inside the compact example (no
    collated special case); CPU-expanded or expanded by the consumer, the batch equals
    `with_templates(featurize)` + `collate_templates(collate)`."""
    from protdp.data.pipeline.expand import to_device
    from protdp.templates.training import collate_templates, with_templates
    from protdp.train.feed import build_micro_batch, collate_fn

    rng = np.random.default_rng(5)
    fams = {}
    for i, T in enumerate((3, 0, 5)):        # a family without templates gets the placeholder
        fam = synthetic_family(60, 40 + 4 * i, 20 + i)
        L = fam["msa"].shape[1]
        fam["templates"] = {"aatype": rng.integers(0, 22, (T, L)).astype(np.int8),
                            "all_atom_positions": rng.normal(size=(T, L, 37, 3)).astype(np.float32),
                            "all_atom_mask": (rng.random((T, L, 37)) < 0.8).astype(np.uint8)}
        fams[f"t{i}"] = fam
    kw = dict(crop_size=36, max_msa_rows=8, max_extra_msa_rows=20, msa_samples=2, training=True)
    payload = {"store": "unused", "fids": list(fams), "seeds": [11, 12, 13], "kwargs": kw,
               "compact": ship_compact, "max_templates": 2}
    out = build_micro_batch(payload, _DictStore(fams))
    if ship_compact:
        out = expand_batch(out["compact"], "cpu", collate_fn=collate_fn(2))
    featurize_t = with_templates(featurize, 2)
    expected = collate_templates(collate)([featurize_t(f, seed=s, **kw)
                                           for f, s in zip(fams.values(), (11, 12, 13))])
    assert "template_aatype" in expected      # the draw took stored templates
    assert_same(expected, to_device(out, torch.device("cpu")))
