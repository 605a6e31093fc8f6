"""Whole model: building from configs, output contract, gradients reach every parameter,
recycling (gradient only through the last pass, rank-consistent sampling), bf16 path."""

import pytest
import torch

from model_fixtures import CONFIG_DIR, random_batch, tiny_config, one_thread  # noqa: F401
from protdp.errors import ConfigError, InputError
from protdp.model import AlphaFoldModel, ModelConfig, build_model, sample_num_recycles
from protdp.model.losses import compute_loss


def _randomize(model, seed=0, scale=0.1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def test_build_from_yaml_mapping_and_object(capsys):
    model = build_model(CONFIG_DIR / "tiny.yaml")
    assert isinstance(model, AlphaFoldModel)
    assert f"{model.num_parameters():,} parameters" in capsys.readouterr().out
    assert build_model({"c_m": 8, "n_blocks": 1}, verbose=False).config.c_m == 8
    cfg = tiny_config()
    assert build_model(cfg, verbose=False).config is cfg


def test_config_errors_name_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("c_m: 16\nc_mm: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*c_mm"):
        build_model(bad)
    bad.write_text("c_m: -4\n")
    with pytest.raises(ConfigError, match="c_m must be a positive integer"):
        build_model(bad)
    bad.write_text("loss:\n  fape_weight: -1\n")
    with pytest.raises(ConfigError, match="fape_weight"):
        build_model(bad)


@pytest.mark.parametrize("name,low,high", [("tiny", 5e3, 5e4), ("small", 1e5, 1e6), ("af2", 85e6, 100e6)])
def test_config_sizes(name, low, high):
    from protdp.config import load_config
    cfg = load_config(ModelConfig, CONFIG_DIR / f"{name}.yaml")
    with torch.device("meta"):
        n = AlphaFoldModel(cfg).num_parameters()
    assert low < n < high, n            # AF2 monomer: ~93M parameters


def test_output_contract_batched_and_unbatched():
    torch.manual_seed(0)
    model = build_model(tiny_config(), verbose=False).eval()
    _randomize(model)
    for B in (None, 2):
        batch = random_batch(L=22, N=13, B=B)
        lead = () if B is None else (B,)
        with torch.no_grad():
            out = model(batch)
        assert out["final_atom_positions"].shape == lead + (22, 37, 3)
        assert out["final_atom_mask"].shape == lead + (22, 37)
        assert torch.all(out["final_atom_positions"][out["final_atom_mask"] == 0] == 0)
        assert out["experimentally_resolved_logits"].shape == lead + (22, 37)
        assert out["single"].shape == lead + (22, model.config.c_s)
        assert out["plddt"].shape == lead + (22,)
        assert torch.all((out["plddt"] >= 0) & (out["plddt"] <= 100))
        assert out["plddt_logits"].shape == lead + (22, 50)
        assert out["distogram_logits"].shape == lead + (22, 22, 64)
        assert out["masked_msa_logits"].shape == lead + (13, 22, 23)
        assert out["sm"]["frames"].shape == (3,) + lead + (22, 4, 4)
        assert out["num_recycles"] == model.config.num_recycles
    with pytest.raises(InputError, match="msa_mask"):
        model({k: v for k, v in batch.items() if k != "msa_mask"})


def test_every_parameter_receives_a_gradient():
    cfg = tiny_config(extra_msa=True, max_msa_clusters=4, pae_head=True,
                      loss={"experimentally_resolved_weight": 0.01, "violation_weight": 1.0})
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False).train()
    _randomize(model, scale=0.2)              # zero-initialised final layers would block gradients
    batch = random_batch(L=12, N=9, B=2)      # 4 cluster rows + 5 extra rows
    out = model(batch, num_recycles=1)
    total, _ = compute_loss(out, batch, cfg)
    total.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_extra_msa_stack_runs_without_extra_rows():
    """A shallow MSA still builds the same graph (one fully masked extra row): every parameter
    gets a gradient tensor, so data-parallel ranks with shallow and deep MSAs stay in step."""
    cfg = tiny_config(extra_msa=True, max_msa_clusters=8)
    torch.manual_seed(0)
    model = build_model(cfg, verbose=False).train()
    _randomize(model, scale=0.2)
    batch = random_batch(L=12, N=5, B=2)      # fewer rows than max_msa_clusters
    out = model(batch, num_recycles=0)
    compute_loss(out, batch, cfg)[0].backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    # the extra stack's pair updates act on z even with no extra sequences
    assert model.extra_msa_stack.blocks[0].tri_mul_out.linear_z.weight.grad.abs().sum() > 0


def test_recycling_gradient_only_through_last_pass():
    torch.manual_seed(0)
    model = build_model(tiny_config(), verbose=False).train()
    _randomize(model, scale=0.2)
    for m in model.modules():                 # deterministic comparison
        if hasattr(m, "p"):
            m.p = 0.0
    grad_enabled = []
    model.evoformer.register_forward_hook(lambda *_: grad_enabled.append(torch.is_grad_enabled()))
    batch = random_batch(L=10, N=4, B=1)
    out = model(batch, num_recycles=2)
    assert grad_enabled == [False, False, True]
    scalar = lambda o: o["final_atom_positions"].sum() + o["distogram_logits"].sum()  # noqa: E731
    scalar(out).backward()
    grads = lambda: [torch.zeros_like(p) if p.grad is None else p.grad.clone()  # noqa: E731
                     for p in model.parameters()]
    auto = grads()
    assert sum(bool(g.abs().sum() > 0) for g in auto) > 20
    # manual: two passes without grad feeding detached state, then one with grad
    model.zero_grad()
    from protdp.model.embedders import pseudo_beta
    prev = None
    with torch.no_grad():
        for _ in range(2):
            o = model.iteration(batch, prev)
            prev = {"m0": o["msa"][..., 0, :, :], "z": o["pair"],
                    "x": pseudo_beta(batch["aatype"], o["final_atom_positions"])}
    scalar(model.iteration(batch, prev)).backward()
    for a, b in zip(auto, grads()):
        assert torch.allclose(a, b, atol=1e-6)
    # recycling changes the result (the recycled state is used)
    with torch.no_grad():
        assert not torch.allclose(model(batch, num_recycles=0)["final_atom_positions"],
                                  model(batch, num_recycles=2)["final_atom_positions"])


def test_num_recycles_sampled_identically_from_same_seed():
    gen_a, gen_b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    seq_a = [sample_num_recycles(gen_a, 3) for _ in range(40)]
    seq_b = [sample_num_recycles(gen_b, 3) for _ in range(40)]
    assert seq_a == seq_b and set(seq_a) == {0, 1, 2, 3}
    model = build_model(tiny_config(max_recycles=3), verbose=False).train()
    gen_a, gen_b = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    batch = random_batch(L=6, N=2, B=1)
    n_a = [model(batch, recycle_generator=gen_a)["num_recycles"] for _ in range(3)]
    n_b = [sample_num_recycles(gen_b, 3) for _ in range(3)]
    assert n_a == n_b
    assert model.eval()(batch, recycle_generator=gen_a)["num_recycles"] == model.config.num_recycles


def test_bf16_autocast_path_runs_on_cpu():
    torch.manual_seed(0)
    fp32 = build_model(tiny_config(), verbose=False).eval()
    _randomize(fp32)
    bf16 = build_model(tiny_config(bf16=True), verbose=False).eval()
    bf16.load_state_dict(fp32.state_dict())
    batch = random_batch(L=16, N=5, B=1)
    with torch.no_grad():
        a, b = fp32(batch, num_recycles=0), bf16(batch, num_recycles=0)
    assert b["final_atom_positions"].dtype == torch.float32
    assert torch.isfinite(b["final_atom_positions"]).all()
    assert (a["plddt"] - b["plddt"]).abs().max() < 5.0
    assert (a["final_atom_positions"] - b["final_atom_positions"]).abs().max() < 1.0
    bf16.train()
    out = bf16(batch, num_recycles=0)
    compute_loss(out, batch, bf16.config)[0].backward()


def test_each_recycling_pass_reads_its_own_msa_sample():
    """MSA keys with a pass axis [*, P, N, L]: pass i reads sample min(i, P-1) (AF2
    resample_msa_in_recycling); the losses read the last pass's sample."""
    from protdp.model.embedders import pseudo_beta
    from protdp.model.inputs import select_pass

    torch.manual_seed(0)
    model = build_model(tiny_config(), verbose=False).eval()
    _randomize(model)
    a, other = random_batch(L=12, N=5, B=1, seed=1), random_batch(L=12, N=5, B=1, seed=2)
    keys = ("msa", "msa_mask", "has_deletion", "deletion_value", "true_msa", "bert_mask")
    b = dict(a, **{k: other[k] for k in keys})                               # a second MSA sample
    batch = dict(a, **{k: torch.stack([a[k], b[k]], dim=1) for k in keys})   # [B, P=2, N, L]
    with torch.no_grad():
        out = model(batch, num_recycles=2)
        assert out["msa_sample"] == 1
        prev = None
        for sample in (a, b, b):                                             # passes 0, 1, 2
            o = model.iteration(sample, prev)
            prev = {"m0": o["msa_first_row"], "z": o["pair"],
                    "x": pseudo_beta(sample["aatype"], o["final_atom_positions"])}
        assert torch.equal(out["final_atom_positions"], o["final_atom_positions"])
        assert not torch.allclose(model(a, num_recycles=2)["final_atom_positions"], o["final_atom_positions"])
        assert torch.equal(select_pass(batch, 5)["true_msa"], b["true_msa"])
    loss_passes, _ = compute_loss(out, batch, model.config)
    loss_b, _ = compute_loss(out, b, model.config)
    assert torch.allclose(loss_passes, loss_b)


def test_bad_token_ids_and_shapes_name_the_key():
    model = build_model(tiny_config(), verbose=False).eval()
    batch = random_batch(L=6, N=3, B=1)
    for key, value in (("msa", 23), ("aatype", -1), ("true_msa", 99)):
        bad = dict(batch, **{key: batch[key].clone()})
        bad[key][0, 0] = value
        with pytest.raises(InputError, match=f"field '{key}': token ids"):
            model(bad)
    with pytest.raises(InputError, match="field 'msa_feat': expected 49 channels"):
        model(dict(batch, msa_feat=torch.zeros(1, 3, 6, 48)))
    with pytest.raises(InputError, match="field 'has_deletion'"):
        model(dict(batch, has_deletion=torch.zeros(1, 3, 7)))
