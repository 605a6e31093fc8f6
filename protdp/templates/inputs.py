"""Template inputs of the model for one target, and custom templates (`--template FILE[:CHAIN]`).

`model_inputs` turns AlphaFold's template dict (`protdp.templates.featurize`) into the model's
keys as AlphaFold's input pipeline does (`fix_templates_aatype`: HHblits one-hot -> AF order
with 20 = X, 21 = gap; `make_template_mask`: one per template row; the first `max_templates`
rows); pseudo-beta is computed in the model.

Sources, per target: the `--template` files given to predict (each aligned to the query with
kalign; a file that is not a structure, a chain that is not in it, a template that cannot be
aligned or contributes no residue is an InputError naming it, never silently dropped), else the
`templates.npz` that `protdp msa search --templates-db` wrote beside the target's MSAs, else
none (the model then sees AlphaFold's own no-template placeholder).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from protdp.data.bounds import MAX_TEMPLATE_FILE_BYTES
from protdp.data.residues import HHBLITS_TO_ID
from protdp.errors import InputError
from protdp.fileio import read_bounded
from protdp.templates.featurize import TemplateError, _features, _stack, kalign
from protdp.templates.mmcif import read_structure
from protdp.templates.run import FEATURES_FILE, RECORD_FILE
from protdp.templates.validate import check_features, read_features, read_record


def model_inputs(features: dict, max_templates: int) -> dict[str, torch.Tensor]:
    """AlphaFold template dict -> model keys (first `max_templates` templates)."""
    aatype = np.asarray(features["template_aatype"])[:max_templates]          # [T, L, 22]
    af_order = HHBLITS_TO_ID.astype(np.int64)[aatype.argmax(-1)]
    T = af_order.shape[0]
    return {"template_aatype": torch.from_numpy(af_order),
            "template_all_atom_positions": torch.from_numpy(np.ascontiguousarray(
                features["template_all_atom_positions"][:max_templates], np.float32)),
            "template_all_atom_masks": torch.from_numpy(np.ascontiguousarray(
                features["template_all_atom_masks"][:max_templates], np.float32)),
            "template_mask": torch.ones(T, dtype=torch.float32)}


def parse_spec(spec: str) -> tuple[Path, str | None]:
    """'FILE.cif[:CHAIN]' -> (path, chain or None)."""
    path, _, chain = spec.rpartition(":") if ":" in Path(spec).name else (spec, "", "")
    return Path(path or spec), (chain or None)


@dataclass(frozen=True)
class TemplateFile:
    """The bytes of one `--template` file, read once when the run starts: their sha256 is the
    prediction's identity (provenance) and every target parses these same bytes, so a file
    replaced mid-run changes nothing. `data` None: not a regular file (each target's error)."""

    spec: str
    data: bytes | None = field(repr=False)
    sha256: str | None


def read_template_file(spec: str) -> TemplateFile:
    """`spec`'s file read once (bounded by MAX_TEMPLATE_FILE_BYTES, protdp.data.bounds)."""
    path, _ = parse_spec(spec)
    if not path.is_file():
        return TemplateFile(str(spec), None, None)
    data = read_bounded(path, MAX_TEMPLATE_FILE_BYTES, "template file")
    return TemplateFile(str(spec), data, hashlib.sha256(data).hexdigest())


def target_template_files(msa_dir, file_name: str) -> list[Path]:
    """The files a target's searched templates are read from (`templates.npz` and its record
    beside the MSAs), those that exist: part of the prediction's identity."""
    if msa_dir is None:
        return []
    folder = Path(msa_dir) / file_name
    if not (folder / FEATURES_FILE).is_file():
        return []
    return [p for p in (folder / FEATURES_FILE, folder / RECORD_FILE) if p.exists()]


def custom_template(query: str, spec: str, kalign_binary: str = "kalign",
                    data: bytes | None = None) -> tuple[dict, dict]:
    """One `--template` structure aligned to `query` -> (AlphaFold feature row, record);
    `data`: the file's bytes read when the run started (`read_template_file`)."""
    path, chain = parse_spec(spec)
    if data is None and not path.is_file():   # a FIFO or device is named as what it is
        raise InputError("not a regular file (a FIFO, device or folder)" if path.exists()
                         else "template file not found", path=path)
    s = read_structure(path, data=data)
    if not s.chain_to_seqres:
        raise InputError("no protein chain with coordinates in the first model", path=path)
    chain = chain or next(iter(s.chain_to_seqres))
    if chain not in s.chain_to_seqres:
        raise InputError(f"chain {chain!r} is not a protein chain of this structure (chains: "
                         f"{', '.join(s.chain_to_seqres)})", path=path)
    seqres = s.chain_to_seqres[chain]
    try:
        q_aln, t_aln = kalign([query, seqres], kalign_binary)
    except TemplateError as exc:
        raise InputError(f"template chain {chain} cannot be aligned to the query: {exc}",
                         path=path) from None
    mapping, qi, ti = {}, -1, -1
    for a, b in zip(q_aln, t_aln):
        qi += a != "-"
        ti += b != "-"
        if a != "-" and b != "-":
            mapping[qi] = ti
    try:
        feats, _, record = _features(s, s.file_id, mapping, seqres, query, chain, kalign_binary)
    except TemplateError as exc:
        raise InputError(f"template chain {chain} contributes no residue to the query ({exc})",
                         path=path) from None
    return feats, {**record, "file": str(path),
                   "query_to_template": [[q, t] for q, t in sorted(mapping.items())]}


@dataclass
class TemplateProvider:
    """Template inputs per target (see the module docstring)."""

    max_templates: int
    specs: tuple[str, ...] = ()
    kalign_binary: str = "kalign"
    files: tuple[TemplateFile, ...] = ()      # the specs' bytes, read once (`read_template_file`)

    def __post_init__(self):
        if self.specs and not self.files:
            self.files = tuple(read_template_file(s) for s in self.specs)

    def for_target(self, query: str, msa_dir, file_name: str) -> tuple[dict, dict]:
        """(model inputs or {}, provenance record {source, templates, warnings})."""
        if self.specs:
            rows, used = zip(*(custom_template(query, f.spec, self.kalign_binary, f.data)
                               for f in self.files))
            feats = check_features(_stack(list(rows)), len(query), ", ".join(self.specs))
            return model_inputs(feats, self.max_templates), {
                "source": "--template", "templates": list(used)[:self.max_templates]}
        paths = target_template_files(msa_dir, file_name)
        if not paths:
            return {}, {"source": None, "templates": []}
        features, record_file = Path(msa_dir) / file_name / FEATURES_FILE, paths[0].with_name(
            RECORD_FILE)
        data = {p: read_bounded(p, MAX_TEMPLATE_FILE_BYTES, "template file") for p in paths}
        feats = read_features(features, len(query), data=data[features])   # checked (issue 47)
        record = read_record(record_file, data.get(record_file))
        return model_inputs(feats, self.max_templates), {
            "source": str(features), **record,
            "templates": record.get("templates", [])[:self.max_templates],
            "files": [{"path": str(p), "sha256": hashlib.sha256(b).hexdigest()}
                      for p, b in data.items()]}       # the bytes parsed (the identity's check)


def template_provider(config, specs: tuple[str, ...]) -> TemplateProvider | None:
    """The provider for a model `config` (None for a template-free model without --template;
    --template with a template-free model is a ConfigError)."""
    from protdp.errors import ConfigError
    if not config.templates:
        if specs:
            raise ConfigError("--template: this checkpoint has no template module (AlphaFold's "
                              "model_1/model_2 and template-trained OpenFold checkpoints have one)")
        return None
    return TemplateProvider(config.max_templates, tuple(specs))


def template_names(record: dict | None) -> list[str] | None:
    """'<pdb>_<chain>' of each template a record lists (None without a template module)."""
    if record is None:
        return None
    return [f"{t['id']}_{t['chain']}" for t in record.get("templates", [])]
