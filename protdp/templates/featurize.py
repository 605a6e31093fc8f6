"""Template features from hits and mmCIF files, as AlphaFold v2.3.2's
`templates.HmmsearchHitFeaturizer.get_templates` computes them (settings of `run_alphafold.py`:
20 hits considered, `max_template_date`, optional obsolete list); the model later takes the first
`max_templates` (4).

Per hit, in hmmsearch order: obsolete ids are skipped or replaced; the prefilter rejects hits
aligning <= 10 % of the query, exact sub-sequences of the query covering > 95 % of it
(duplicates of the query) and templates shorter than 10 residues; the mmCIF's release date must
not be after the cutoff; the query->hit mapping is read from the alignment; the hit sequence is
located in the mmCIF chain (same chain, any chain, then X as wildcard), else realigned with
kalign to the chain's seqres (>= 90 % identity required); atom37 coordinates are gathered along
the mapping. A template whose query-aligned sequence was already taken is dropped. With no
template AlphaFold's placeholder is returned: one all-zero template, empty name and sequence.

The dict uses AlphaFold's keys: `template_aatype` (T, L, 22) one-hot in HHblits order,
`template_all_atom_positions` (T, L, 37, 3), `template_all_atom_masks` (T, L, 37),
`template_domain_names` / `template_sequence` (T,) bytes, `template_sum_probs` (T, 1).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.data.residues import HHBLITS_ORDER
from protdp.errors import InputError
from protdp.templates.hits import TemplateHit
from protdp.templates.mmcif import ATOM37, TemplateStructure, atom_positions, read_structure

MAX_TEMPLATE_HITS = 20            # AF2 run_alphafold.py MAX_TEMPLATE_HITS
MAX_SUBSEQUENCE_RATIO = 0.95      # AF2 _assess_hhsearch_hit defaults
MIN_ALIGN_RATIO = 0.1
MIN_TEMPLATE_LENGTH = 10
MIN_REALIGN_IDENTITY = 0.9        # AF2 _realign_pdb_template_to_query
KALIGN_MIN_LENGTH = 6             # AF2 tools/kalign.py


class TemplateError(Exception):
    """A hit that cannot be featurized (AF2 `templates.Error` family): reported as an error."""


class TemplateDataError(TemplateError):
    """Missing experimental data (AF2 NoChains / NoAtomData / TemplateAtomMaskAllZeros):
    AlphaFold reports these as warnings, not errors."""


@dataclass
class TemplateResult:
    """Features, AlphaFold's error/warning strings and what each kept template is."""

    features: dict
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    used: list[dict] = field(default_factory=list)


def parse_obsolete(path: str | Path) -> dict[str, str | None]:
    """PDB `obsolete.dat` -> {old id: replacement or None} (AF2 `_parse_obsolete`; a removed
    entry is a 24-character line: AF2 compares the length with its newline still attached and
    so misses newline-terminated ones, protdp strips it and honours them)."""
    result = {}
    for line in Path(path).read_text().splitlines(keepends=True):
        if line.startswith("OBSLTE"):
            if len(line) > 30:
                result[line[20:24].lower()] = line[29:33].lower()
            elif len(line.rstrip("\r\n")) == 24:
                result[line[20:24].lower()] = None
    return result


def kalign(sequences: list[str], binary: str = "kalign") -> list[str]:
    """Align with the kalign binary as AF2's `tools/kalign.py` calls it; aligned rows."""
    for s in sequences:
        if len(s) < KALIGN_MIN_LENGTH:
            raise TemplateError(f"Kalign requires all sequences to be at least 6 residues long. "
                                f"Got {s} ({len(s)} residues).")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "input.fasta"), os.path.join(tmp, "output.a3m")
        Path(src).write_text("".join(f">sequence {i}\n{s}\n" for i, s in enumerate(sequences, 1)))
        try:
            proc = subprocess.run([binary, "-i", src, "-o", dst, "-format", "fasta"],
                                  capture_output=True, text=True)
        except OSError as exc:
            raise TemplateError(f"kalign could not be run ({binary}): {exc}") from None
        if proc.returncode or not os.path.exists(dst):
            raise TemplateError(f"kalign failed: {proc.stderr.strip()[-300:]}")
        rows, seq = [], None
        for line in Path(dst).read_text().splitlines():
            if line.startswith(">"):
                seq = []
                rows.append(seq)
            elif seq is not None:
                seq.append(line.strip())
    return ["".join(c for c in "".join(r) if not c.islower()) for r in rows]


def query_to_hit_mapping(hit: TemplateHit, query: str) -> dict[int, int]:
    """AF2 `_build_query_to_hit_index_mapping`: query index -> index in the gapless hit."""
    if not hit.query:
        return {}
    hit_query = hit.query.replace("-", "")
    hit_seq = hit.hit_sequence.replace("-", "")
    offset = query.find(hit_query)
    lo_hit = min(x for x in hit.indices_hit if x > -1)
    lo_query = min(x for x in hit.indices_query if x > -1)
    mapping = {}
    for q, t in zip(hit.indices_query, hit.indices_hit):
        q, t = (q - lo_query if q > -1 else -1), (t - lo_hit if t > -1 else -1)
        if t != -1 and q != -1 and t < len(hit_seq) and q + offset < len(query):
            mapping[q + offset] = t
    return mapping


def _find_in_structure(chain: str, template: str, s: TemplateStructure) -> tuple[str, str, int]:
    """AF2 `_find_template_in_pdb`: (seqres, chain id, offset) or TemplateError."""
    seqres = s.chain_to_seqres.get(chain)
    if seqres and template in seqres:
        return seqres, chain, seqres.find(template)
    for cid, seqres in s.chain_to_seqres.items():
        if seqres and template in seqres:
            return seqres, cid, seqres.find(template)
    regex = re.compile("".join("." if aa == "X" else f"(?:{aa}|X)" for aa in template))
    for cid, seqres in s.chain_to_seqres.items():
        m = regex.search(seqres)
        if m:
            return seqres, cid, m.start()
    raise TemplateError(f"Could not find the template sequence in {s.file_id}_{chain}.")


def _realign(old: str, chain: str, s: TemplateStructure, mapping: dict[int, int],
             kalign_binary: str) -> tuple[str, dict[int, int]]:
    """AF2 `_realign_pdb_template_to_query`: map through a kalign alignment of the hit's
    sequence with the mmCIF chain's seqres."""
    new = s.chain_to_seqres.get(chain, "")
    if not new:
        if len(s.chain_to_seqres) != 1:
            raise TemplateError(f"Could not find chain {chain} in {s.file_id}.")
        new = next(iter(s.chain_to_seqres.values()))
    old_aln, new_aln = kalign([old, new], kalign_binary)
    old_to_new, i_old, i_new, same = {}, -1, -1, 0
    for a, b in zip(old_aln, new_aln):
        i_old += a != "-"
        i_new += b != "-"
        if a != "-" and b != "-":
            old_to_new[i_old] = i_new
            same += a == b
    if same / min(len(old), len(new)) < MIN_REALIGN_IDENTITY:
        raise TemplateError(f"Insufficient similarity of the sequence in the database: {old} to "
                            f"the actual sequence in the mmCIF file {s.file_id}_{chain}: {new}.")
    return new.replace("-", ""), {q: old_to_new.get(t, -1) for q, t in mapping.items()}


def _one_hot(sequence: str) -> np.ndarray:
    """AF2 `sequence_to_onehot(seq, HHBLITS_AA_TO_ID)` -> [L, 22]."""
    table = {c: i for i, c in enumerate(HHBLITS_ORDER)}
    table.update({"B": table["D"], "J": table["X"], "O": table["X"], "U": table["C"],
                  "Z": table["E"]})
    out = np.zeros((len(sequence), len(HHBLITS_ORDER)), np.int64)
    out[np.arange(len(sequence)), [table[c] for c in sequence]] = 1
    return out


def _features(s: TemplateStructure, pdb: str, mapping: dict[int, int], template: str,
              query: str, chain: str, kalign_binary: str) -> tuple[dict, str | None, dict]:
    """AF2 `_extract_template_features` -> (features, realignment warning, provenance)."""
    if not s.chain_to_seqres:
        raise TemplateDataError(f"No chains in PDB: {pdb}_{chain}")
    warning = None
    try:
        seqres, chain_id, offset = _find_in_structure(chain, template, s)
    except TemplateError:
        chain_id = chain
        warning = (f"The exact sequence {template} was not found in {pdb}_{chain_id}. "
                   "Realigning the template to the actual sequence.")
        seqres, mapping = _realign(template, chain, s, mapping, kalign_binary)
        template, offset = seqres, 0
    try:
        pos, mask = atom_positions(s, chain_id)
    except (ValueError, KeyError) as exc:
        raise TemplateDataError(f"Could not get atom data ({pdb}_{chain_id}): {exc}") from None
    L = len(query)
    out_pos = np.zeros((L, ATOM37, 3), np.float32)
    out_mask = np.zeros((L, ATOM37), np.float32)
    out_seq = ["-"] * L
    for q, t in mapping.items():
        out_pos[q], out_mask[q], out_seq[q] = pos[t + offset], mask[t + offset], template[t]
    if out_mask.sum() < 5:
        raise TemplateDataError(f"Template all atom mask was all zeros: {pdb}_{chain_id}.")
    seq = "".join(out_seq)
    aligned = [q for q, t in mapping.items() if t != -1]
    same = sum(query[q] == seq[q] for q in aligned)
    prov = {"id": pdb, "chain": chain_id, "release_date": str(s.release_date),
            "aligned_residues": len(aligned), "identity": round(same / max(len(aligned), 1), 4)}
    return ({"template_all_atom_positions": out_pos, "template_all_atom_masks": out_mask,
             "template_sequence": seq.encode(), "template_aatype": _one_hot(seq),
             "template_domain_names": f"{pdb.lower()}_{chain_id}".encode()}, warning, prov)


def placeholder(length: int) -> dict:
    """AF2's no-template features: one all-zero template, empty name and sequence."""
    return {"template_aatype": np.zeros((1, length, 22), np.float32),
            "template_all_atom_masks": np.zeros((1, length, ATOM37), np.float32),
            "template_all_atom_positions": np.zeros((1, length, ATOM37, 3), np.float32),
            "template_domain_names": np.array([b""], dtype=object),
            "template_sequence": np.array([b""], dtype=object),
            "template_sum_probs": np.array([0], dtype=np.float32)}


def _stack(rows: list[dict]) -> dict:
    return {"template_aatype": np.stack([r["template_aatype"] for r in rows]).astype(np.float32),
            "template_all_atom_masks": np.stack([r["template_all_atom_masks"] for r in rows]),
            "template_all_atom_positions": np.stack([r["template_all_atom_positions"] for r in rows]),
            "template_domain_names": np.array([r["template_domain_names"] for r in rows], dtype=object),
            "template_sequence": np.array([r["template_sequence"] for r in rows], dtype=object),
            "template_sum_probs": np.zeros((len(rows), 1), np.float32)}


@dataclass
class Featurizer:
    """AF2 `HmmsearchHitFeaturizer` (see the module docstring)."""

    mmcif_dir: Path
    max_template_date: dt.date
    max_hits: int = MAX_TEMPLATE_HITS
    kalign_binary: str = "kalign"
    obsolete: dict = field(default_factory=dict)
    release_dates: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False)

    def structure(self, pdb: str) -> TemplateStructure:
        if pdb not in self._cache:
            path = Path(self.mmcif_dir) / f"{pdb}.cif"
            if not path.is_file():
                raise InputError(f"mmCIF for template {pdb} not found", path=path)
            self._cache[pdb] = read_structure(path, pdb)
        return self._cache[pdb]

    def _single(self, query: str, hit: TemplateHit):
        """(features, error, warning, provenance) for one hit (AF2 `_process_single_hit`)."""
        m = re.match(r"[a-zA-Z\d]{4}_[a-zA-Z0-9.]+", hit.name)
        if not m:
            raise InputError(f"hit name {hit.name!r} does not start with PDBID_chain")
        pdb, chain = m.group(0).split("_")
        pdb = pdb.lower()
        if pdb in self.obsolete and self.obsolete[pdb] is None:
            return None, None, f"Hit {pdb} is obsolete.", None
        if pdb not in self.release_dates and pdb in self.obsolete:
            pdb = self.obsolete[pdb]
        template = hit.hit_sequence.replace("-", "")
        if pdb in self.release_dates and self.release_dates[pdb] > self.max_template_date:
            return None, None, None, None                                   # DateError
        if hit.aligned_cols / len(query) <= MIN_ALIGN_RATIO:
            return None, None, None, None                                   # AlignRatioError
        if template in query and len(template) / len(query) > MAX_SUBSEQUENCE_RATIO:
            return None, None, None, None                                   # DuplicateError
        if len(template) < MIN_TEMPLATE_LENGTH:
            return None, None, None, None                                   # LengthError
        mapping = query_to_hit_mapping(hit, query)
        s = self.structure(pdb)
        if s.release_date is None:
            raise InputError("mmCIF has no _pdbx_audit_revision_history.revision_date (release "
                             "date)", path=Path(self.mmcif_dir) / f"{pdb}.cif")
        if s.release_date > self.max_template_date:
            return None, None, None, None
        try:
            feats, warning, prov = _features(s, pdb, mapping, template, query, chain,
                                             self.kalign_binary)
            return feats, None, warning, prov
        except TemplateDataError as exc:      # AF2 turns missing-data errors into warnings
            return None, None, f"{pdb}_{chain} (rank: {hit.index}): feature extracting " \
                f"errors: {exc}", None
        except TemplateError as exc:
            return None, f"{pdb}_{chain} (rank: {hit.index}): feature extracting errors: {exc}", \
                None, None

    def get_templates(self, query: str, hits: list[TemplateHit]) -> TemplateResult:
        result, rows, seen = TemplateResult({}), [], set()
        for hit in hits:
            if len(seen) >= self.max_hits:
                break
            feats, error, warning, prov = self._single(query, hit)
            if error:
                result.errors.append(error)
            if warning:
                result.warnings.append(warning)
            if feats is None or feats["template_sequence"] in seen:
                continue
            seen.add(feats["template_sequence"])
            rows.append(feats)
            result.used.append(prov)
        result.features = _stack(rows) if rows else placeholder(len(query))
        return result
