"""Pretraining pieces that need no process group: flags, LR schedule, EMA, report, checkpoint dirs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from protdp.errors import ConfigError, InputError
from protdp.train import checkpointing, report
from protdp.train import cli as train_cli
from protdp.train.args import TrainArgs, build_parser, parse_args
from protdp.train.ema import EMA
from protdp.train.schedule import lr_at

MEGATRON = ["--data", "d.h5", "--model-config", "configs/model/small.yaml",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--data-parallel-size", "2", "--micro-batch-size", "1", "--global-batch-size", "8",
            "--overlap-grad-reduce", "--use-distributed-optimizer", "--train-iters", "200",
            "--save", "ckpt/", "--save-interval", "50"]


def test_issue_command_line_parses():
    a = parse_args(MEGATRON)
    assert (a.data_parallel_size, a.micro_batch_size, a.global_batch_size) == (2, 1, 8)
    assert a.overlap_grad_reduce and a.use_distributed_optimizer
    assert a.check_batch(2) == 4  # accumulation steps
    assert a.save == "ckpt/" and a.save_interval == 50 and a.wandb_mode == "offline"


def test_every_field_has_a_flag():
    flags = {opt for act in build_parser()._actions for opt in act.option_strings}
    for name in TrainArgs.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in flags


def test_yaml_then_flags_override(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("lr: 5.0e-4\nmicro-batch-size: 2\ntrain_iters: 7\noverlap_grad_reduce: true\n")
    a = parse_args(["--config", str(cfg), "--train-iters", "9", "--no-overlap-grad-reduce"])
    assert (a.lr, a.micro_batch_size, a.train_iters, a.overlap_grad_reduce) == (5e-4, 2, 9, False)


def test_repo_train_configs_load():
    for name in ("tiny", "demo", "af2", "finetune"):
        a = parse_args(["--config", f"configs/train/{name}.yaml", "--data", "x.h5", "--save", "c"])
        assert a.train_iters >= 1


@pytest.mark.parametrize("argv, needle", [
    (["--micro-batch-size", "1", "--data-parallel-size", "2", "--global-batch-size", "7"],
     "--global-batch-size 7 is not divisible"),
    (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size"),
    (["--pipeline-model-parallel-size", "4"], "--pipeline-model-parallel-size"),
    (["--save-interval", "5"], "needs --save"),
    (["--lr-decay-style", "exp"], "--lr-decay-style"),
    (["--wandb-mode", "cloud"], "--wandb-mode"),
    (["--min-lr", "1", "--lr", "0.1"], "--min-lr"),
    (["--lr-warmup-iters", "50", "--train-iters", "10"], "--lr-warmup-iters"),
    (["--micro-batch-size", "0"], "--micro-batch-size"),
    (["--overlap-param-gather"], "--use-distributed-optimizer"),
])
def test_bad_flags_are_clear_errors(argv, needle):
    with pytest.raises(ConfigError, match=needle.replace("-", r"\-").replace("+", r"\+")):
        parse_args(argv)


def test_unknown_yaml_key_and_bad_value(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("learning_rate: 1\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        parse_args(["--config", str(cfg)])
    with pytest.raises(SystemExit):  # argparse: not an int
        parse_args(["--train-iters", "many"])


@pytest.mark.parametrize("content, expected", [
    (b"model: [unclosed\n", r"t.yaml:2:1: invalid YAML: expected ',' or ']'"),
    (b"a: 1\n a: 2\n", r"t.yaml:2:3: invalid YAML: mapping values are not allowed here"),
    (b">a\nMKV\n", r"t.yaml:1:2: invalid YAML: "),              # a FASTA given as --config
    (b"\x00\xff\xfe", r"t.yaml: not a text \(UTF-8\) YAML file"),
    (b"- 1\n- 2\n", r"t.yaml: expected a mapping at the top level"),
    (None, r"t.yaml: a directory, not a config file")])
def test_a_broken_config_file_is_one_line_with_its_line_and_column(tmp_path, content, expected):
    cfg = tmp_path / "t.yaml"
    cfg.mkdir() if content is None else cfg.write_bytes(content)
    with pytest.raises(ConfigError, match=expected) as err:
        parse_args(["--config", str(cfg)])
    assert "\n" not in str(err.value)


def test_world_size_must_match_dp():
    a = parse_args(["--data-parallel-size", "2"])
    with pytest.raises(ConfigError, match="world size 1"):
        a.check_world(1)
    b = parse_args(["--global-batch-size", "6"]).check_world(3)
    assert (b.data_parallel_size, b.global_batch_size) == (3, 6)
    with pytest.raises(ConfigError, match="not divisible"):
        parse_args(["--global-batch-size", "6"]).check_world(4)


def test_lr_schedule_shapes():
    kw = dict(lr=1.0, min_lr=0.1, warmup_iters=4, decay_iters=14)
    warm = [lr_at(i, style="linear", **kw) for i in range(4)]
    assert warm == [0.25, 0.5, 0.75, 1.0]
    lin = [lr_at(i, style="linear", **kw) for i in range(4, 15)]
    assert lin[0] == 1.0 and math.isclose(lin[5], 0.55) and math.isclose(lin[-1], 0.1)
    assert all(x >= y for x, y in zip(lin, lin[1:]))
    cos = [lr_at(i, style="cosine", **kw) for i in range(4, 15)]
    assert cos[0] == 1.0 and math.isclose(cos[5], 0.55) and math.isclose(cos[-1], 0.1)
    assert cos[2] > lin[2]  # cosine stays high early
    assert lr_at(100, style="linear", **kw) == pytest.approx(0.1)  # clamped past the horizon
    assert lr_at(9, style="constant", **kw) == 1.0


def test_ema_matches_closed_form_and_swaps_back():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    w0 = model[0].weight.detach().clone()
    ema = EMA(model, decay=0.9)
    ema.num_updates = 1000  # past the warm-up: d = 0.9
    for _ in range(3):
        with torch.no_grad():
            model[0].weight.add_(1.0)
        ema.update(model)
    # shadow = 0.9^3 w0 + 0.1 (0.9^2 (w0+1) + 0.9 (w0+2) + (w0+3))
    expected = 0.9 ** 3 * w0 + 0.1 * (0.81 * (w0 + 1) + 0.9 * (w0 + 2) + (w0 + 3))
    torch.testing.assert_close(ema.shadow["0.weight"], expected)
    fresh = EMA(model, decay=0.999)  # warm-up: d_0 = 1/10, d_1 = 2/11
    w = model[0].weight.detach().clone()
    fresh.update(model)
    torch.testing.assert_close(fresh.shadow["0.weight"], w)  # 0.1 w + 0.9 w
    assert fresh.current_decay() == 2 / 11
    current = model[0].weight.detach().clone()
    with ema.swapped_into(model):
        torch.testing.assert_close(model[0].weight, expected)
    assert torch.equal(model[0].weight, current)
    other = EMA(model, decay=0.5)
    other.load_state_dict(ema.state_dict())
    assert other.decay == 0.9 and other.num_updates == 1003 and torch.equal(other.shadow["0.weight"], ema.shadow["0.weight"])
    # a state read onto the CPU lands on the device of this model's shadow (another GPU on a
    # cluster; the meta device here), so update() never mixes devices
    on_meta = EMA(torch.nn.Sequential(torch.nn.Linear(3, 4, device="meta"),
                                      torch.nn.BatchNorm1d(4, device="meta")))
    on_meta.load_state_dict(ema.state_dict())
    assert {v.device.type for v in on_meta.shadow.values()} == {"meta"}
    assert on_meta.shadow["0.weight"].shape == ema.shadow["0.weight"].shape


def _fake_save(tmp_path, its, keep=2, in_use=set):
    saver = checkpointing.Saver(rank=0, world_size=1, barrier=lambda: None,
                                save_engine=lambda p: p.mkdir(), keep_last=keep, in_use=in_use)
    for it in its:
        checkpointing.save_checkpoint(saver, tmp_path, it, ema_state={"decay": 0.9, "shadow": {
                                          "w": torch.full((2,), float(it))}}, rank_state={"sampler": it},
                                      config={"x": 1})


def test_checkpoints_keep_last_k_and_are_atomic(tmp_path):
    _fake_save(tmp_path, [5, 10, 15])
    assert checkpointing.list_checkpoints(tmp_path) == [10, 15]
    assert (tmp_path / checkpointing.TRACKER).read_text() == "15"
    # a crash mid-save leaves an incomplete tmp folder: the previous checkpoint still loads
    (tmp_path / "iter_0000020.tmp").mkdir()
    (tmp_path / "iter_0000025").mkdir()  # no meta.json: not complete
    latest = checkpointing.latest_checkpoint(tmp_path)
    assert latest.name == "iter_0000015"
    got = checkpointing.load_checkpoint(latest, rank=0)
    assert got.iteration == 15 and got.rank_state["sampler"] == 15 and "rng" in got.rank_state
    assert torch.equal(got.ema_state["shadow"]["w"], torch.full((2,), 15.0))
    assert (latest / checkpointing.ENGINE).is_dir()
    assert got.meta["code_version"]["protdp"]
    assert checkpointing.load_checkpoint(latest, rank=3).rank_state is None
    # tracker pointing at a missing folder falls back to a scan
    (tmp_path / checkpointing.TRACKER).write_text("99")
    assert checkpointing.latest_checkpoint(tmp_path).name == "iter_0000015"


def test_pruning_spares_a_checkpoint_that_is_being_read(tmp_path):
    """keep-last pruning leaves the folder a running release check reads; a later save prunes it."""
    _fake_save(tmp_path, [5, 10, 15, 20], in_use=lambda: {tmp_path / "iter_0000005"})
    assert checkpointing.list_checkpoints(tmp_path) == [5, 15, 20]
    _fake_save(tmp_path, [25])
    assert checkpointing.list_checkpoints(tmp_path) == [20, 25]


def test_release_checks_run_one_at_a_time_newest_next(tmp_path):
    """Real processes stand in for `protdp release` (each writes its folder's name to a file and
    waits for a go file), so the order and overlap of the checks can be read back."""
    import sys
    import time

    from protdp.train.release_jobs import ReleaseChecks

    go, ran = tmp_path / "go", tmp_path / "ran.txt"
    script = ("import pathlib, sys, time\n"
              f"go = pathlib.Path({str(go)!r})\n"
              "name = pathlib.Path(sys.argv[1]).name\n"
              f"open({str(ran)!r}, 'a').write(name + ' start\\n')\n"
              "while not go.exists(): time.sleep(0.02)\n"
              f"open({str(ran)!r}, 'a').write(name + ' end\\n')\n")
    lines: list[str] = []
    checks = ReleaseChecks(log=lines.append,
                           command=lambda ck: [sys.executable, "-c", script, str(ck)])
    ckpts = [tmp_path / f"iter_{i}" for i in range(4)]
    for c in ckpts:
        c.mkdir()
    checks.submit(ckpts[0])
    assert checks.in_use() == {ckpts[0]}
    checks.submit(ckpts[1])                  # waits
    checks.submit(ckpts[2])                  # replaces the waiting one
    assert checks.waiting == ckpts[2] and checks.skipped == [ckpts[1]]
    assert "iter_1 skipped" in lines[0] and "iter_2 is newer" in lines[0]
    checks.poll()                            # iter_0 still running: nothing starts
    assert checks.launched == [ckpts[0]]
    go.touch()
    deadline = time.monotonic() + 60
    while checks.launched == [ckpts[0]] and time.monotonic() < deadline:
        time.sleep(0.05)
        checks.poll()                        # iter_0 ended: the waiting iter_2 starts
    assert checks.launched == [ckpts[0], ckpts[2]]
    checks.submit(ckpts[3])
    last = checks.finish()                   # waits for iter_2, then checks iter_3
    assert last.path == ckpts[3] and last.proc.returncode == 0
    assert checks.running is None and checks.waiting is None and checks.in_use() == set()
    # never two at once, the skipped one never ran, the newest ran last
    assert ran.read_text().splitlines() == [f"iter_{i} {e}" for i in (0, 2, 3)
                                            for e in ("start", "end")]
    assert (ckpts[3] / "release.log").is_file()


def test_rng_state_round_trip():
    state = checkpointing.rng_state()
    a = (torch.rand(3), __import__("random").random(), __import__("numpy").random.rand())
    checkpointing.set_rng_state(state)
    b = (torch.rand(3), __import__("random").random(), __import__("numpy").random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


def test_report_renders_pngs_and_rejects_garbage(tmp_path):
    recs = []
    for it in range(1, 7):
        recs.append({"type": "train", "iteration": it, "loss": 3.0 / it, "loss/fape": 1.0 / it, "lr": 1e-3,
                     "train_lddt_ca": 0.1 * it, "time/step": 0.5, "time/data_wait": 0.05,
                     "time/forward": 0.15, "time/backward": 0.2, "time/exposed_comm": 0.05,
                     "time/optimizer": 0.05, "samples_per_s": 8.0, "residues_per_s": 400.0,
                     "max_memory_mb": 300.0})
    recs.append({"type": "eval", "iteration": 5, "val_lddt_ca": 0.3, "val_plddt_spearman": 0.2})
    lines = [json.dumps(r) for r in recs] + ['{"type": "train", "iter']  # torn last line
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    train, evals = report.read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in train] == list(range(1, 7)) and len(evals) == 1
    assert train_cli.report([str(tmp_path)]) == 0
    for name in ("loss", "lddt", "breakdown", "throughput"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    (tmp_path / "metrics.jsonl").write_text("garbage\n" + "\n".join(lines[:2]))
    with pytest.raises(InputError, match="metrics.jsonl:1"):
        report.read_metrics(tmp_path / "metrics.jsonl")
    with pytest.raises(InputError, match="no metrics.jsonl"):
        train_cli.report([str(tmp_path / "nowhere")])


def test_split_families_is_seeded_disjoint_and_validated():
    from protdp.train.trainer import split_families

    ids = [f"f{i:02d}" for i in range(20)]
    a = parse_args(["--val-fraction", "0.15", "--seed", "3"])
    train, val = split_families(list(reversed(ids)), a)
    assert len(val) == 3 and set(train) | set(val) == set(ids) and not set(train) & set(val)
    assert split_families(ids, a) == (train, val)  # order of the store does not matter
    assert split_families(ids, parse_args(["--val-fraction", "0.15", "--seed", "4"]))[1] != val
    assert split_families(ids, parse_args(["--val-fraction", "0.01"]))[1].__len__() == 1
    assert split_families(ids, parse_args(["--val-fraction", "0"]))[1] == []
    named = split_families(ids, parse_args(["--val-families", "f05, f07"]))
    assert named[1] == ["f05", "f07"] and "f05" not in named[0]
    with pytest.raises(ConfigError, match="f99"):
        split_families(ids, parse_args(["--val-families", "f99"]))
    with pytest.raises(ConfigError, match="no training families"):
        split_families(["f00"], parse_args(["--val-fraction", "0.5"]))


def test_derive_seed_is_stable_and_distinct():
    from protdp.train.trainer import derive_seed

    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert len({derive_seed(1234, it, m) for it in range(50) for m in range(4)}) == 200
    assert 0 <= derive_seed(2**40, -1) < 2**31


def test_damaged_meta_json_is_one_line_naming_it(tmp_path):
    """An iter_N/meta.json holding binary data or a JSON list was a UnicodeDecodeError /
    TypeError traceback in `train --load` and `predict --checkpoint`."""
    from protdp.parallel.checkpoint import _read_meta
    meta = tmp_path / "iter_0000001" / "meta.json"
    (meta.parent / checkpointing.ENGINE).mkdir(parents=True)
    for data, why in ((b"\x7fELF\x02\x01\x01\x00\xf0\x9f", "invalid JSON"),
                      (b"[1]", "a JSON list, expected the checkpoint's meta object")):
        meta.write_bytes(data)
        for read in (lambda: checkpointing.load_checkpoint(meta.parent, 0),
                     lambda: checkpointing.read_weights(meta.parent),
                     lambda: _read_meta(meta.parent)):
            with pytest.raises(InputError, match=f"meta.json: {why}"):
                read()
    meta.write_text("{}")
    with pytest.raises(InputError, match="meta.json: field 'iteration': no iteration"):
        checkpointing.load_checkpoint(meta.parent, 0)
