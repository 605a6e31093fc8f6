"""Every importer at any shape (issue 42): configurations in which every width differs from
every other (distinct primes: MSA, pair, single, structure-module, extra-MSA and template
channels, head counts, per-head widths, IPA scalar / point sizes, outer-product and
triangle-multiplication widths), AlphaFold / OpenFold-layout arrays made by protdp's own export
of a randomly initialised model, then

- import -> export bit-identical to the exported arrays,
- the imported model's forward equal (bit for bit) to the exported model's,
- the imported config equal to the one exported in every size the arrays carry.

Importers: AlphaFold monomer, AlphaFold monomer with templates, AlphaFold-Multimer (v3 fused
and v2 unfused Evoformer triangle projections) and OpenFold `.pt`. An importer that assumes one
width equals another (the multimer importer before issue 42 took the structure module's width
for the single representation's) fails here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from model_fixtures import one_thread, random_backbone  # noqa: F401
from protdp.data.features import collate, featurize_query
from protdp.model.config import ModelConfig
from protdp.model.model import AlphaFoldModel
from protdp.model.multimer.msa import MaskedMsaConfig
from protdp.model.multimer.model import MULTIMER_POSITION_SCALE, MultimerConfig, MultimerModel
from protdp.weights.alphafold_multimer import multimer_arrays_from_state
from protdp.weights.convert import export_arrays, export_openfold, import_params
from protdp.weights.multimer_checkpoint import import_multimer
from protdp.weights.store import write_npz

# one value per width; the test checks below that no two coincide
TRUNK = dict(c_m=11, c_z=13, c_s=17, c_sm=19, c_e=23, msa_heads=2, c_hidden_msa_att=3,
             pair_heads=5, c_hidden_tri_att=7, c_hidden_tri_mul=29, c_hidden_opm=31,
             c_hidden_extra_att=37, ipa_heads=41, c_ipa=43, c_ipa_v=47, ipa_qk_points=53,
             ipa_v_points=59, c_resnet=61, c_plddt=67)
MONOMER_TEMPLATES = dict(c_t=71, template_tri_heads=73, c_hidden_template_tri_att=79,
                         c_hidden_template_tri_mul=83, template_att_heads=89,
                         c_hidden_template_att=97)
MULTIMER_TEMPLATES = dict(c_t=71, template_heads=73, c_hidden_template_att=79,
                          c_hidden_template_mul=83)
BLOCKS = dict(n_blocks=2, n_extra_blocks=1, sm_layers=2, transition_n=2, num_recycles=0,
              max_recycles=0, msa_dropout=0.0, pair_dropout=0.0, sm_dropout=0.0,
              template_dropout=0.0, extra_msa=True, pae_head=True)
# sizes not in the arrays (given to the importer) or not sizes
NOT_IN_ARRAYS = {"sm_layers", "num_recycles", "max_recycles", "msa_dropout", "pair_dropout",
                 "sm_dropout", "template_dropout", "loss", "max_msa_clusters", "max_templates",
                 "recompute", "chunk_size", "bf16", "attention_backend"}


def test_the_widths_are_distinct():
    for widths in ({**TRUNK, **MONOMER_TEMPLATES}, {**TRUNK, **MULTIMER_TEMPLATES}):
        assert len(set(widths.values())) == len(widths)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (no zero / one initialisation can hide a transposition)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _bit_identical(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype == np.float32 and x.shape == y.shape, k
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), k


def _same_config(got, want) -> None:
    for f in dataclasses.fields(want):
        if f.name not in NOT_IN_ARRAYS:
            assert getattr(got, f.name) == getattr(want, f.name), f.name


def _monomer_batch(L: int = 9, templates: bool = False) -> dict:
    batch = collate([featurize_query("MKVLAAGIV"[:L], None)])
    if templates:                  # two real-looking templates, so the template weights act
        g = torch.Generator().manual_seed(3)
        pos = torch.zeros(1, 2, L, 37, 3)
        pos[..., :3, :] = torch.stack([random_backbone(L, g)[:, :3] for _ in range(2)])[None]
        mask = torch.zeros(1, 2, L, 37)
        mask[..., :3] = 1.0
        batch.update(template_aatype=torch.randint(0, 20, (1, 2, L), generator=g),
                     template_all_atom_positions=pos, template_all_atom_masks=mask,
                     template_mask=torch.ones(1, 2))
    return batch


@pytest.mark.parametrize("fmt", ["alphafold", "openfold"])
@pytest.mark.parametrize("templates", [False, True], ids=["plain", "templates"])
def test_monomer_importers_at_distinct_widths(fmt, templates, tmp_path):
    extra = dict(MONOMER_TEMPLATES, templates=True, template_pair_blocks=2) if templates else {}
    if fmt == "openfold" and templates:
        # OpenFold's files have no per-head tensor of the template pointwise attention: its
        # head count is OpenFold's fixed 4 (protdp.weights.openfold.TEMPLATE_POINTWISE_HEADS)
        extra["template_att_heads"] = 4
    cfg = ModelConfig(**TRUNK, **BLOCKS, **extra, relpos_k=8)   # multimer: fixed encoding
    torch.manual_seed(0)
    model = AlphaFoldModel(cfg).eval()
    _randomise(model, 1)
    arrays = export_arrays(model)
    if fmt == "alphafold":
        path = tmp_path / "params.npz"
        write_npz(path, arrays)
    else:
        path = tmp_path / "params.pt"
        torch.save(export_openfold(model), path)
    imported = import_params(path, fmt, sm_layers=cfg.sm_layers, num_recycles=0)
    _same_config(imported.config, cfg)
    _bit_identical(export_arrays(imported.model), arrays)
    if fmt == "openfold":
        again = export_openfold(imported.model)
        original = torch.load(path, weights_only=True)
        assert again.keys() == original.keys()
        assert all(torch.equal(again[k], original[k]) for k in again)
    batch = _monomer_batch(templates=templates)
    with torch.no_grad():
        want, got = model(batch, num_recycles=0), imported.model.eval()(batch, num_recycles=0)
    for key in ("final_atom_positions", "plddt", "pae_logits", "distogram_logits"):
        assert torch.equal(want[key], got[key]), key
    assert want["sm"]["single"].shape[-1] == TRUNK["c_sm"] != TRUNK["c_s"]


def _multimer_batch(L_a: int = 5, L_b: int = 4, n_msa: int = 7, n_templates: int = 2) -> dict:
    """A two-chain complex (chain B a second entity) with random MSA and template backbones."""
    g = torch.Generator().manual_seed(5)
    L = L_a + L_b
    pos = torch.zeros(n_templates, L, 37, 3)
    pos[..., :3, :] = torch.stack([random_backbone(L, g)[:, :3] for _ in range(n_templates)])
    mask = torch.zeros(n_templates, L, 37)
    mask[..., :3] = 1.0
    return {"aatype": torch.randint(0, 20, (L,), generator=g),
            "residue_index": torch.cat([torch.arange(L_a), torch.arange(L_b)]),
            "asym_id": torch.tensor([1] * L_a + [2] * L_b),
            "entity_id": torch.tensor([1] * L_a + [2] * L_b),
            "sym_id": torch.ones(L, dtype=torch.long), "seq_mask": torch.ones(L),
            "msa": torch.randint(0, 21, (n_msa, L), generator=g),
            "deletion_matrix": torch.rand(n_msa, L, generator=g),
            "msa_mask": torch.ones(n_msa, L), "cluster_bias_mask": torch.zeros(n_msa),
            "template_aatype": torch.randint(0, 20, (n_templates, L), generator=g),
            "template_all_atom_positions": pos, "template_all_atom_mask": mask}


NO_BERT = MaskedMsaConfig(replace_fraction=0.0)     # no random masking: equal inputs


def _multimer_config() -> MultimerConfig:
    trunk = ModelConfig(**TRUNK, **BLOCKS, position_scale=MULTIMER_POSITION_SCALE)
    return MultimerConfig(trunk=trunk, num_msa=4, num_extra_msa=3, templates=True,
                          template_blocks=2, template_transition_n=3, **MULTIMER_TEMPLATES,
                          masking=NO_BERT)


@pytest.mark.parametrize("fused", [True, False], ids=["v3_fused", "v2_unfused"])
def test_multimer_importer_at_distinct_widths(fused, tmp_path):
    cfg = _multimer_config()
    model = MultimerModel(cfg).eval()
    _randomise(model, 2)
    with torch.no_grad():   # AlphaFold-Multimer's IPA scalar projections have no bias
        model.structure_module.ipa.linear_q.bias.zero_()
        model.structure_module.ipa.linear_kv.bias.zero_()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    arrays = multimer_arrays_from_state(state, cfg, fused_evoformer=fused)
    path = tmp_path / "params_model_1_multimer_v3.npz"
    write_npz(path, arrays)
    imported, _ = import_multimer(path, sm_layers=cfg.trunk.sm_layers, num_recycles=0,
                                  num_msa=cfg.num_msa, num_extra_msa=cfg.num_extra_msa,
                                  masking=NO_BERT)
    _same_config(imported.config.trunk, cfg.trunk)
    for name in ("templates", "c_t", "template_blocks", "template_heads",
                 "c_hidden_template_att", "c_hidden_template_mul", "template_transition_n"):
        assert getattr(imported.config, name) == getattr(cfg, name), name
    again = {k: v.numpy() for k, v in imported.state_dict().items()}
    _bit_identical(multimer_arrays_from_state(again, imported.config, fused_evoformer=fused),
                   arrays)
    batch = _multimer_batch()
    orders = [torch.randperm(7, generator=torch.Generator().manual_seed(7))]
    with torch.no_grad():
        want, got = model(batch, orders=orders), imported(batch, orders=orders)
    for key in ("final_atom_positions", "plddt", "ptm", "iptm", "pae_logits", "single"):
        assert torch.equal(want[key], got[key]), key
    assert want["sm"]["single"].shape[-1] == TRUNK["c_sm"] != TRUNK["c_s"]
