"""Residue placement: where each observed residue sits in the chain's sequence (pure functions).

The order of evidence (issue 17; AF2 `mmcif_parsing` uses `_pdbx_poly_seq_scheme` the same way):

1. mmCIF `label_seq_id` (the file's own mapping onto `_entity_poly_seq`), when it is present for
   every observed residue and the residue types agree;
2. author numbering (numbers + insertion codes) onto SEQRES / `_entity_poly_seq`: the numbering
   gives each residue's relative position, one offset places them all, and every residue type
   must agree;
3. sequence alignment (global, free end gaps) only where numbering is absent or inconsistent,
   with the inconsistency recorded in the chain's warnings;
4. no reference sequence: the observed residues are the sequence, and chain breaks stay breaks.
   A break is a CA-CA distance > 4.2 Å, or a numbering gap with a CA missing on either side; the
   `residue_index` jumps there (by the numbering gap, at least by the residues needed to span
   the distance at 3.8 Å per residue) and `between_segment` is set on the residue after it.
   A numbering gap across bonded residues (CA-CA <= 4.2 Å, e.g. chymotrypsin numbering) is a
   numbering-scheme skip, not a break (recorded as a warning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CHAIN_BREAK_CA_DISTANCE = 4.2   # Å: consecutive CA atoms further apart are not bonded
CA_STEP = 3.8                   # Å between bonded CA atoms (trans peptide): sizes unknown gaps


@dataclass
class Placement:
    """Observed residues placed on the chain's sequence."""
    sequence: str                   # [L] reference sequence, or the observed letters
    index: np.ndarray               # int64 [n_obs] position of each observed residue in sequence
    residue_index: np.ndarray       # int32 [L] AF2 residue_index (jumps at unfilled breaks)
    between_segment: np.ndarray     # bool [L] first residue after a chain break
    method: str                     # 'label_seq_id' | 'numbering' | 'alignment' | 'observed'
    warnings: list[str] = field(default_factory=list)


def _consistent(a: str, b: str) -> bool:
    return a == b or a == "X" or b == "X"


def letters_agree(observed: str, reference: str, index: np.ndarray) -> bool:
    """Every observed letter equals the reference letter at its index (X matches anything)."""
    return all(_consistent(o, reference[k]) for o, k in zip(observed, index.tolist()))


def numbering_positions(authors: list[tuple[int, str]]) -> np.ndarray | None:
    """Relative sequence position of each residue implied by its author numbering (first = 0):
    +1 to the next number or the next insertion code, +k+1 across k missing numbers.
    None if the numbering ever goes backwards (then numbering cannot place residues)."""
    pos = np.zeros(len(authors), np.int64)
    for i in range(1, len(authors)):
        (n0, i0), (n1, i1) = authors[i - 1], authors[i]
        if n1 == n0 and i1 > i0:
            step = 1                                   # 65 -> 65A, 65A -> 65B
        elif n1 > n0:
            step = n1 - n0
        else:
            return None
        pos[i] = pos[i - 1] + step
    return pos


def place_by_numbering(observed: str, authors: list[tuple[int, str]], reference: str
                       ) -> tuple[np.ndarray | None, str]:
    """Index of each observed residue in `reference` from the author numbering, or (None, why).
    The offset is the one where every residue type agrees; numbering from 1 is preferred when
    several agree (e.g. low-complexity sequences)."""
    rel = numbering_positions(authors)
    if rel is None:
        return None, "the residue numbering is not increasing"
    if not len(rel):
        return None, "no residues"
    span = int(rel[-1])
    if span >= len(reference):
        return None, (f"the numbering spans {span + 1} positions but the reference has "
                      f"{len(reference)} residues")
    natural = authors[0][0] - 1                  # author number 1 = first reference residue
    ref = np.frombuffer(reference.encode("ascii"), np.uint8)
    obs = np.frombuffer(observed.encode("ascii"), np.uint8)
    x = ord("X")
    good = []
    for off in range(0, len(reference) - span):
        r = ref[rel + off]
        if np.all((r == obs) | (r == x) | (obs == x)):
            good.append(off)
    if not good:
        return None, "no offset of the numbering matches the reference residue types"
    off = min(good, key=lambda o: (abs(o - natural), o))
    return rel + off, "" if len(good) == 1 else f"{len(good)} numbering offsets fit"


def _aligner():
    from Bio.Align import PairwiseAligner
    al = PairwiseAligner()
    al.mode = "global"
    al.match_score, al.mismatch_score = 2.0, -3.0
    al.wildcard = "X"
    al.open_gap_score, al.extend_gap_score = -5.0, -0.5
    al.end_gap_score = 0.0
    return al


def align_map(a: str, b: str) -> np.ndarray:
    """Global alignment with free end gaps (X = wildcard): int64 [len(a)] index into b or -1."""
    out = np.full(len(a), -1, np.int64)
    if not a or not b:
        return out
    if a == b:
        return np.arange(len(a))
    off = a.find(b)
    if off >= 0:                       # fast path: b is a contiguous part of a
        out[off:off + len(b)] = np.arange(len(b))
        return out
    off = b.find(a)
    if off >= 0:
        return np.arange(off, off + len(a))
    aln = _aligner().align(a, b)[0]
    for (s0, e0), (s1, _) in zip(*aln.aligned):
        out[s0:e0] = np.arange(s1, s1 + e0 - s0)
    return out


def place_by_alignment(observed: str, reference: str) -> np.ndarray | None:
    """Alignment placement (fallback): every residue placed, increasing, types agreeing."""
    m = align_map(observed, reference)
    if (m >= 0).all() and np.all(np.diff(m) > 0) and letters_agree(observed, reference, m):
        return m
    return None


def break_steps(authors: list[tuple[int, str]], ca: np.ndarray, ca_mask: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Without a reference: residue_index step into each residue (int64 [n], step[0] = 0),
    break flags (bool [n]) and warnings for numbering skips across bonded residues."""
    n = len(authors)
    steps = np.zeros(n, np.int64)
    breaks = np.zeros(n, bool)
    warnings = []
    for i in range(1, n):
        (n0, i0), (n1, i1) = authors[i - 1], authors[i]
        monotonic = n1 > n0 or (n1 == n0 and i1 > i0)
        gap = max(n1 - n0 - 1, 0) if monotonic else 0           # missing numbers
        d = float(np.linalg.norm(ca[i] - ca[i - 1])) if ca_mask[i] and ca_mask[i - 1] else None
        if d is not None and d <= CHAIN_BREAK_CA_DISTANCE:
            steps[i] = 1
            if gap:
                warnings.append(f"numbering skips {gap} residue(s) between {n0}{i0} and "
                                f"{n1}{i1} but their CA atoms are {d:.1f} Å apart (bonded): "
                                f"kept adjacent")
        elif d is not None:
            breaks[i] = True
            steps[i] = max(gap + 1, math.ceil(d / CA_STEP), 2)
        elif gap:
            breaks[i] = True
            steps[i] = gap + 1
        else:
            steps[i] = 1
    return steps, breaks, warnings


def place_without_reference(observed: str, authors, ca, ca_mask) -> Placement:
    steps, breaks, warnings = break_steps(authors, ca, ca_mask)
    return Placement(observed, np.arange(len(observed)), np.cumsum(steps).astype(np.int32),
                     breaks, "observed", warnings)


def _on_reference(reference: str, index: np.ndarray, method: str, warnings) -> Placement:
    L = len(reference)
    return Placement(reference, np.asarray(index, np.int64), np.arange(L, dtype=np.int32),
                     np.zeros(L, bool), method, list(warnings))


def place_residues(observed: str, authors: list[tuple[int, str]], ca: np.ndarray,
                   ca_mask: np.ndarray, reference: str | None,
                   label_index: np.ndarray | None = None) -> Placement:
    """Place observed residues (letters [n], author (number, icode) [n], CA [n, 3] + mask [n])
    on `reference` (SEQRES / _entity_poly_seq, or None); `label_index` [n] = label_seq_id - 1
    from mmCIF where every residue has one. See the module docstring for the rules."""
    if not reference:
        return place_without_reference(observed, authors, ca, ca_mask)
    warnings = []
    if label_index is not None:
        idx = np.asarray(label_index, np.int64)
        if ((idx >= 0) & (idx < len(reference))).all() and np.all(np.diff(idx) > 0) and \
                letters_agree(observed, reference, idx):
            return _on_reference(reference, idx, "label_seq_id", warnings)
        warnings.append("label_seq_id does not fit _entity_poly_seq (residue types or order "
                        "differ); placing by author numbering")
    idx, why = place_by_numbering(observed, authors, reference)
    if idx is not None:
        if why:
            warnings.append(f"author numbering is ambiguous on the reference ({why}); "
                            f"numbering from 1 kept")
        return _on_reference(reference, idx, "numbering", warnings)
    idx = place_by_alignment(observed, reference)
    if idx is not None:
        warnings.append(f"residue numbering inconsistent with the reference sequence ({why}); "
                        f"placed by sequence alignment")
        return _on_reference(reference, idx, "alignment", warnings)
    warnings.append(f"observed residues do not fit the reference sequence ({why}; alignment "
                    f"fails too); using the observed residues only")
    p = place_without_reference(observed, authors, ca, ca_mask)
    p.warnings = warnings + p.warnings
    return p
