"""AlphaFold-compatibility measurements (issue 16 D8), run by `benchmarks/model.py --issue16`:

1. structure module, all-atom vs backbone-only, forward + backward with its losses at the AF2
   sizes (c_s 384, c_z 128, 12 IPA heads, 8 layers), L = 128 and 256: backbone-only is the
   Alg. 20 loop (IPA, transition, backbone update) with the per-layer backbone FAPE; all-atom
   adds the torsion resnet per layer, side chains (Alg. 24), all-atom FAPE with renaming, the
   torsion loss and the violation loss (what fine-tuning from AF2 weights runs);
2. `protdp weights import` of a random npz with the published model_1_ptm shapes (every protdp
   parameter at AF2 sizes with the pTM head, plus model_1's template modules, skipped on import):
   wall time and peak RSS of the importing process against the file size;
3. the imported parameter count against the file's.

Each case runs in its own process (`--case JSON`) so its peak RSS is its own.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEMPLATE = "alphafold/alphafold_iteration/evoformer/template_embedding/single_template_embedding/"


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def af2_config(**overrides):
    from protdp.config import load_config, read_yaml
    from protdp.model import ModelConfig
    data = read_yaml(ROOT / "configs" / "model" / "af2.yaml")
    data.update(pae_head=True, sm_dropout=0.0, **overrides)
    return load_config(ModelConfig, data)


def _template_shapes() -> dict[str, tuple]:
    """model_1's template modules (AF2 v2.3.2 config: 2 template pair blocks of 64 channels,
    4 heads of 16, pointwise attention 4 x 16, 88 input pair features, 57 torsion features)."""
    shapes = {TEMPLATE + "embedding2d//weights": (88, 64), TEMPLATE + "embedding2d//bias": (64,),
              TEMPLATE + "output_layer_norm//scale": (64,), TEMPLATE + "output_layer_norm//offset": (64,)}
    stack = TEMPLATE + "template_pair_stack/__layer_stack_no_state/"
    for att in ("triangle_attention_starting_node", "triangle_attention_ending_node"):
        shapes.update({f"{stack}{att}/query_norm//scale": (2, 64), f"{stack}{att}/query_norm//offset": (2, 64),
                       f"{stack}{att}//feat_2d_weights": (2, 64, 4),
                       **{f"{stack}{att}/attention//{w}": (2, 64, 4, 16)
                          for w in ("query_w", "key_w", "value_w", "gating_w")},
                       f"{stack}{att}/attention//gating_b": (2, 4, 16),
                       f"{stack}{att}/attention//output_w": (2, 4, 16, 64),
                       f"{stack}{att}/attention//output_b": (2, 64)})
    for mul in ("triangle_multiplication_outgoing", "triangle_multiplication_incoming"):
        for ln in ("layer_norm_input", "center_layer_norm"):
            shapes.update({f"{stack}{mul}/{ln}//scale": (2, 64), f"{stack}{mul}/{ln}//offset": (2, 64)})
        for lin in ("left_projection", "right_projection", "left_gate", "right_gate",
                    "output_projection", "gating_linear"):
            shapes.update({f"{stack}{mul}/{lin}//weights": (2, 64, 64), f"{stack}{mul}/{lin}//bias": (2, 64)})
    tr = stack + "pair_transition/"
    shapes.update({tr + "input_layer_norm//scale": (2, 64), tr + "input_layer_norm//offset": (2, 64),
                   tr + "transition1//weights": (2, 64, 128), tr + "transition1//bias": (2, 128),
                   tr + "transition2//weights": (2, 128, 64), tr + "transition2//bias": (2, 64)})
    pointwise = "alphafold/alphafold_iteration/evoformer/template_embedding/attention//"
    shapes.update({pointwise + "query_w": (128, 4, 16), pointwise + "key_w": (64, 4, 16),
                   pointwise + "value_w": (64, 4, 16), pointwise + "output_w": (4, 16, 128),
                   pointwise + "output_b": (128,)})
    evo = "alphafold/alphafold_iteration/evoformer/"
    shapes.update({evo + "template_single_embedding//weights": (57, 256),
                   evo + "template_single_embedding//bias": (256,),
                   evo + "template_projection//weights": (256, 256),
                   evo + "template_projection//bias": (256,)})
    return shapes


def write_model_1_ptm(path: Path) -> dict:
    """A random npz with model_1_ptm's shapes (float32); returns its sizes."""
    import numpy as np
    import torch

    from protdp.model import AlphaFoldModel
    from protdp.weights.alphafold import alphafold_entries
    from protdp.weights.store import write_npz

    cfg = af2_config()
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in AlphaFoldModel(cfg).state_dict().items()}
    af2 = {}
    for e in alphafold_entries(cfg, shapes):
        blocks = cfg.n_blocks if "evoformer_iteration" in e.af2 else cfg.n_extra_blocks
        af2[e.af2] = e.af2_shape if e.block is None else (blocks,) + e.af2_shape
    templates = _template_shapes()
    rng = np.random.default_rng(0)
    arrays = {k: rng.standard_normal(s, dtype=np.float32) * 0.02 for k, s in {**af2, **templates}.items()}
    write_npz(path, arrays)
    return {"file_mib": round(path.stat().st_size / 2 ** 20, 1), "arrays": len(arrays),
            "values": int(sum(a.size for a in arrays.values())),
            "template_values": int(sum(math.prod(s) for s in templates.values()))}


def _sm_inputs(cfg, L: int):
    import torch

    from protdp.model.structure import StructureModule
    g = torch.Generator().manual_seed(0)
    aatype = torch.randint(0, 20, (1, L), generator=g)
    s = torch.randn(1, L, cfg.c_s, generator=g)
    z = torch.randn(1, L, L, cfg.c_z, generator=g)
    truth_sm = StructureModule(cfg)
    with torch.no_grad():
        for p in truth_sm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        true = truth_sm(s, z, torch.ones(1, L), aatype)
    batch = {"aatype": aatype, "seq_mask": torch.ones(1, L), "residue_index": torch.arange(L)[None],
             "all_atom_positions": true["atom_positions"], "all_atom_mask": (true["atom_positions"].abs().sum(-1) > 0).float(),
             "resolution": torch.tensor([2.0])}
    return s, z, aatype, batch


def _backbone_only(sm, s, z, mask):
    """Alg. 20's loop without the torsion resnet and side chains -> per-layer frames (Å)."""
    import torch

    from protdp.model.rigid import Rigid
    s_initial = sm.norm_s(s)
    z = sm.norm_z(z)
    s = sm.linear_in(s_initial)
    quat = torch.zeros(s.shape[:-1] + (4,))
    quat[..., 0] = 1.0
    frames = Rigid.identity(s.shape[:-1])
    traj = []
    for layer in range(sm.n_layers):
        s = sm.norm_ipa(sm.ipa_dropout(s + sm.ipa(s, z, frames, mask)))
        s = sm.transition(s)
        quat, frames = sm.backbone_update(s, quat, frames)
        traj.append(Rigid(frames.rot, frames.trans * sm.position_scale))
        if layer < sm.n_layers - 1:
            quat, frames = quat.detach(), Rigid(frames.rot.detach(), frames.trans)
    return traj


def sm_case(case: dict) -> dict:
    """One structure-module measurement (forward + backward with its losses)."""
    import torch

    from protdp.model.ground_truth import structure_truth
    from protdp.model.losses import fape, structure_losses
    from protdp.model.structure import StructureModule
    from protdp.model.violations import violation_loss
    torch.set_num_threads(1)
    cfg = af2_config()
    s, z, aatype, batch = _sm_inputs(cfg, case["L"])
    torch.manual_seed(1)
    sm = StructureModule(cfg)
    with torch.no_grad():
        for p in sm.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    mask = torch.ones(1, case["L"])
    times = []
    before = _rss_mib()
    for _ in range(case["repeats"]):
        t = time.perf_counter()
        if case["all_atom"]:
            out = sm(s, z, mask, aatype)
            terms = structure_losses({"sm": out}, batch, cfg.loss)
            loss = (0.5 * terms["fape"] + 0.5 * (terms["backbone_fape"] + terms["torsion"])).sum()
            loss = loss + violation_loss(out["atom14_positions"], aatype, batch["residue_index"], mask).sum()
        else:
            truth = structure_truth(batch)
            gt, gt_mask = truth["frames"].index((..., 0)), truth["backbone_mask"]
            loss = sum(fape(f, gt, gt_mask, f.trans, gt.trans, gt_mask) for f in _backbone_only(sm, s, z, mask))
            loss = (loss / cfg.sm_layers).sum()
        loss.backward()
        times.append(time.perf_counter() - t)
        sm.zero_grad(set_to_none=True)
    return {"time_s": round(min(times), 4), "peak_mib": round(_peak_mib() - before, 1)}


def import_case(case: dict) -> dict:
    """`protdp weights import` in this process; RSS before (interpreter, torch) and peak."""
    from protdp.weights import cli
    baseline = _rss_mib()
    t = time.perf_counter()
    rc = cli.main(["import", "--format", "alphafold", case["npz"], "--out", case["out"]])
    wall = time.perf_counter() - t
    return {"rc": rc, "wall_s": round(wall, 2), "rss_before_mib": round(baseline, 1),
            "peak_rss_mib": round(_peak_mib(), 1), "import_added_mib": round(_peak_mib() - baseline, 1)}


def _run(case: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {**case, "error": proc.stderr.strip().splitlines()[-1]}
    return {**case, **json.loads(proc.stdout.strip().splitlines()[-1])}


def run_all(out: Path, quick: bool = False) -> int:
    results = {"structure_module": [], "import": {}}
    for L in ((128,) if quick else (128, 256)):
        rows = [_run({"mode": "sm", "all_atom": a, "L": L, "repeats": 2}) for a in (False, True)]
        for r in rows:
            print(f"structure module L={L} all_atom={r['all_atom']}: {r.get('time_s')} s, "
                  f"{r.get('peak_mib')} MiB", flush=True)
        results["structure_module"] += rows
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "params_model_1_ptm_random.npz"
        sizes = write_model_1_ptm(npz)
        run = _run({"mode": "import", "npz": str(npz), "out": str(Path(tmp) / "ckpt")})
        prov = json.loads((Path(tmp) / "ckpt" / "provenance.json").read_text()) if "error" not in run else {}
    results["import"] = {**sizes, **{k: v for k, v in run.items() if k not in ("npz", "out", "mode")},
                         "peak_rss_over_file": round(run.get("peak_rss_mib", 0) / sizes["file_mib"], 2),
                         "import_added_over_file": round(run.get("import_added_mib", 0) / sizes["file_mib"], 2),
                         "protdp_parameters": prov.get("protdp_parameters"),
                         "alphafold_parameters": sizes["values"],
                         "skipped_arrays": len(prov.get("skipped", {})),
                         "targets": "<= 30 s and <= 2x the file size"}
    print(json.dumps(results["import"], indent=1), flush=True)
    sm = {(r["L"], r["all_atom"]): r for r in results["structure_module"] if "error" not in r}
    summary = {f"sm_all_atom_over_backbone_time_L{L}": round(sm[(L, True)]["time_s"] / sm[(L, False)]["time_s"], 2)
               for L in {k[0] for k in sm} if (L, True) in sm and (L, False) in sm}
    summary.update({f"sm_all_atom_over_backbone_memory_L{L}":
                    round(sm[(L, True)]["peak_mib"] / max(sm[(L, False)]["peak_mib"], 1e-9), 2)
                    for L in {k[0] for k in sm} if (L, True) in sm and (L, False) in sm})
    from benchmarks.model_params import param_counts
    doc = json.loads(out.read_text()) if out.is_file() else {}
    doc["parameters"] = param_counts()      # the current model's counts (cheap, meta device)
    doc["af2_compatibility"] = {"host_load_avg_1m_at_end": os.getloadavg()[0], "torch_threads": 1,
                                "summary": summary, **results}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        c = json.loads(sys.argv[2])
        print(json.dumps(sm_case(c) if c["mode"] == "sm" else import_case(c)))
        sys.exit(0)
    sys.exit(run_all(ROOT / "benchmarks" / "results" / "model.json", quick="--quick" in sys.argv))
