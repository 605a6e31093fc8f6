"""Templates in training (issue 31 D5): stored per family, sampled as AlphaFold samples them.

Store: an optional group `/families/<id>/templates` (docs/store_format.md; its own
`format_version` attribute, 1; readers that do not know it ignore it, as the store's
compatibility rule says): `aatype` int8 [T, L] (AF order, 21 = gap), `all_atom_positions`
float32 [T, L, 37, 3], `all_atom_mask` uint8 [T, L, 37], `domain_names` [T] — the family's
template hits featurized against its full-length sequence.

Sampling (AF2 `input_pipeline` with `subsample_templates=True` in training,
`data_transforms.random_crop_to_size`): the templates are shuffled, a start offset is drawn
uniformly from [0, T] and up to `max_templates` templates are taken from it, so a training
example sees between 0 and `max_templates` templates; at evaluation the first `max_templates`
in order. The residue crop is the example's own. A family without templates, or a draw of
none, gives AlphaFold's placeholder row in the model (template_mask 1, all atoms masked).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from protdp.data.features import _rng, crop_start
from protdp.data.residues import HHBLITS_TO_ID

TEMPLATES_GROUP = "templates"
TEMPLATES_FORMAT_VERSION = 1
_SAMPLE_STREAM = 31                  # rng stream of the template draw (seed, 31)


def write_family_templates(h5, family_id: str, features: dict) -> None:
    """Store AlphaFold template features (`protdp.templates.featurize` dict, full-length
    family) under the family's group, replacing earlier ones."""
    import h5py
    g = h5[f"families/{family_id}"]
    if TEMPLATES_GROUP in g:
        del g[TEMPLATES_GROUP]
    L = int(g.attrs["length"])
    aatype = HHBLITS_TO_ID.astype(np.int8)[np.asarray(features["template_aatype"]).argmax(-1)]
    if aatype.shape[1] != L:
        raise ValueError(f"family {family_id}: templates cover {aatype.shape[1]} residues, the "
                         f"family has {L}")
    t = g.create_group(TEMPLATES_GROUP)
    t.attrs["format_version"] = TEMPLATES_FORMAT_VERSION
    t.create_dataset("aatype", data=aatype)
    t.create_dataset("all_atom_positions",
                     data=np.asarray(features["template_all_atom_positions"], np.float32))
    t.create_dataset("all_atom_mask", data=np.asarray(features["template_all_atom_masks"], np.uint8))
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in features["template_domain_names"]]
    t.create_dataset("domain_names", data=np.array(names, dtype=object), dtype=h5py.string_dtype())


def sample_templates(num: int, max_templates: int, rng: np.random.Generator,
                     training: bool) -> np.ndarray:
    """Indices of the templates an example uses (see the module docstring)."""
    if not training:
        return np.arange(min(num, max_templates))
    start = int(rng.integers(0, num + 1))
    order = rng.permutation(num)
    return order[start:start + min(num - start, max_templates)]


def example_templates(stored: dict, window: slice, indices: np.ndarray) -> dict:
    """The model's template keys for one example (AF names) from the stored arrays."""
    return {"template_aatype": torch.from_numpy(stored["aatype"][indices][:, window].astype(np.int64)),
            "template_all_atom_positions": torch.from_numpy(
                np.ascontiguousarray(stored["all_atom_positions"][indices][:, window], np.float32)),
            "template_all_atom_masks": torch.from_numpy(
                stored["all_atom_mask"][indices][:, window].astype(np.float32)),
            "template_mask": torch.ones(len(indices), dtype=torch.float32)}


def with_templates(featurize: Callable, max_templates: int) -> Callable:
    """Wrap `protdp.data.features.featurize`: the same example plus the template keys (the
    residue window is featurize's own: the same seeded crop start)."""
    def run(family: dict, **kw) -> dict:
        ex = featurize(family, **kw)
        stored = family.get("templates")
        if not stored or len(stored["aatype"]) == 0:
            return ex
        L = int(np.asarray(family["msa"]).shape[1])
        start = crop_start(L, kw.get("crop_size"), _rng(kw["seed"], 0), kw.get("training", True))
        window = slice(start, start + int(ex["num_residues"]))
        idx = sample_templates(len(stored["aatype"]), max_templates,
                               _rng(kw["seed"], _SAMPLE_STREAM), kw.get("training", True))
        if len(idx):
            ex.update(example_templates(stored, window, idx))
        return ex
    return run


def collate_templates(collate: Callable) -> Callable:
    """Wrap `collate`: template keys zero-padded to the batch's T and L (padding templates have
    template_mask 0); examples without templates get AlphaFold's placeholder row."""
    keys = ("template_aatype", "template_all_atom_positions", "template_all_atom_masks",
            "template_mask")

    def run(examples: list[dict]) -> dict:
        batch = collate(examples)
        if not any("template_mask" in e for e in examples):
            return batch
        L = batch["aatype"].shape[-1]
        T = max(int(e["template_mask"].shape[0]) if "template_mask" in e else 1 for e in examples)
        B = len(examples)
        out = {"template_aatype": torch.zeros(B, T, L, dtype=torch.int64),
               "template_all_atom_positions": torch.zeros(B, T, L, 37, 3),
               "template_all_atom_masks": torch.zeros(B, T, L, 37),
               "template_mask": torch.zeros(B, T)}
        for b, e in enumerate(examples):
            if "template_mask" not in e:
                out["template_mask"][b, 0] = 1.0                 # AF2 placeholder row
                continue
            t, n = e["template_mask"].shape[0], e["template_aatype"].shape[-1]
            for k in keys:
                out[k][(b, slice(0, t)) + ((slice(0, n),) if k != "template_mask" else ())] = e[k]
        batch.update(out)
        return batch
    return run
