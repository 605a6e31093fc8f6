"""Interface confidence per chain pair from PAE, pLDDT and coordinates, as DunbrackLab/IPSAE's
`ipsae.py` (version 4, January 2026) defines it (Dunbrack 2025, "Rēs ipSAE loquunt: What's
wrong with AlphaFold's ipTM score and how to fix it", bioRxiv 10.1101/2025.02.10.637595):

* TM term  f(e, d0) = 1 / (1 + (e / d0)^2) of a PAE value e (Å);
* d0(L)    = max(m, 1.24 (L - 15)^(1/3) - 1.8) for L > 27 else m, m = 1 (2 when either chain
  is a nucleic acid, `NUCLEIC_D0_MIN`) (Yang & Skolnick 2004); the per-residue d0res rule
  clips L to at least 26 instead (`d0_per_residue`), as ipsae.py's `calc_d0_array` does;
* for the ordered pair (A, B) and each residue i of A (the aligned chain), with
  V_i = {j in B : PAE_ij < pae_cutoff}:
    ipTM_d0chn(i)  = mean_{j in B}  f(PAE_ij, d0(|A| + |B|))      (no cutoff)
    ipSAE_d0chn(i) = mean_{j in V_i} f(PAE_ij, d0(|A| + |B|))
    ipSAE_d0dom(i) = mean_{j in V_i} f(PAE_ij, d0(n0dom)), n0dom = residues of A with any
                     V_i plus residues of B in any V_i (counted by residue number)
    ipSAE(i)       = mean_{j in V_i} f(PAE_ij, d0res(|V_i|))        (the d0res variant)
  and each asym score is the maximum over i (the first maximum over all N positions, so a pair
  without any V_i reports position 0's n0res/d0res, as ipsae.py does); the max row of {A, B}
  takes the larger of the two asym values (ties: the (B, A) side for B > A);
* pDockQ (Bryant, Pozzati & Elofsson 2022, Nat Commun 13:1265): x = mean Cβ-pLDDT over the
  residues of the A–B contacts (Cβ–Cβ <= 8 Å) * log10(number of contacts),
  pDockQ = 0.724 / (1 + exp(-0.052 (x - 152.611))) + 0.018;
* pDockQ2 (Zhu, Shenoy, Kundrotas & Elofsson 2023, Bioinformatics 39:btad424): x = the same
  mean pLDDT * the mean over contacts of f(PAE_ij, 10), pDockQ2 = 1.31 / (1 + exp(-0.075
  (x - 84.733))) + 0.005;
* LIS (Kim et al. 2024, bioRxiv 10.1101/2024.02.19.580970): mean over A×B PAE values < 12 of
  (12 - PAE) / 12; the max row averages both directions;
* dist_cutoff only counts interface residues (columns dist1/dist2: PAE < pae_cutoff and
  Cβ–Cβ < dist_cutoff), as in ipsae.py.

Distances are between Cβ atoms (Cα for glycine; C3' for nucleotides); a residue is a token with
a Cα (C1' for nucleotides). Everything is float64 numpy; inputs are one complex with N residues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_PAE_CUTOFF = 10.0          # Å, ipsae.py's recommended PAE cutoff for AF2/AF3
DEFAULT_DIST_CUTOFF = 10.0         # Å, interface residue counting only
PDOCKQ_CONTACT = 8.0               # Å, Cβ–Cβ contact for pDockQ / pDockQ2 (Bryant 2022)
PDOCKQ2_D0 = 10.0                  # Å, d0 of pDockQ2's TM term (Zhu 2023)
LIS_PAE_CUTOFF = 12.0              # Å, LIS (Kim 2024)
PROTEIN_D0_MIN = 1.0
NUCLEIC_D0_MIN = 2.0               # ipsae.py: d0 >= 2 for pairs with a nucleic-acid chain
NUCLEIC_RESIDUES = frozenset({"DA", "DC", "DT", "DG", "A", "C", "U", "G"})

# the columns of one row (ipsae.py's output columns, lower case) in the order written
ROW_KEYS = ("chain_1", "chain_2", "type", "ipsae", "ipsae_d0chn", "ipsae_d0dom", "iptm_d0chn",
            "pdockq", "pdockq2", "lis", "n0res", "n0chn", "n0dom", "d0res", "d0chn", "d0dom",
            "nres1", "nres2", "dist1", "dist2", "pae_cutoff", "dist_cutoff")


@dataclass(frozen=True)
class Residues:
    """One complex, one entry per residue token, in the PAE's order."""
    chain_ids: np.ndarray        # [N] str
    residue_names: np.ndarray    # [N] str, e.g. "ALA", "DA"
    residue_numbers: np.ndarray  # [N] int (ipsae.py counts n0dom by these within each chain)
    cb: np.ndarray               # [N, 3] Å, Cβ (Cα for glycine, C3' for nucleotides)

    @property
    def chains(self) -> list[str]:
        """Chain ids in order of first appearance."""
        _, first = np.unique(self.chain_ids, return_index=True)
        return [str(c) for c in self.chain_ids[np.sort(first)]]


def tm_term(pae: np.ndarray, d0) -> np.ndarray:
    """f(e, d0) = 1 / (1 + (e / d0)^2), elementwise (d0 a scalar or broadcastable array)."""
    return 1.0 / (1 + (pae / d0) ** 2.0)


def d0_of_length(n: float, nucleic: bool = False) -> float:
    """d0 of a residue count (ipsae.py `calc_d0`): 1 for n <= 27."""
    n = float(n)
    d0 = 1.24 * (n - 15) ** (1.0 / 3.0) - 1.8 if n > 27 else 1.0
    return max(NUCLEIC_D0_MIN if nucleic else PROTEIN_D0_MIN, d0)


def d0_per_residue(n: np.ndarray, nucleic: bool = False) -> np.ndarray:
    """d0 of per-residue counts [N] (ipsae.py `calc_d0_array`: the count clipped to >= 26)."""
    n = np.maximum(26, np.asarray(n, dtype=float))
    return np.maximum(NUCLEIC_D0_MIN if nucleic else PROTEIN_D0_MIN,
                      1.24 * (n - 15) ** (1.0 / 3.0) - 1.8)


def pdockq(mean_plddt: float, contacts: int) -> float:
    """pDockQ of a mean interface pLDDT and a contact count (Bryant 2022)."""
    x = mean_plddt * math.log10(contacts)
    return 0.724 / (1 + math.exp(-0.052 * (x - 152.611))) + 0.018


def pdockq2(mean_plddt: float, mean_tm: float) -> float:
    """pDockQ2 of a mean interface pLDDT and a mean TM term of the contacts' PAE (Zhu 2023)."""
    x = mean_plddt * mean_tm
    return 1.31 / (1 + math.exp(-0.075 * (x - 84.733))) + 0.005


def lis(pae_block: np.ndarray) -> float:
    """LIS of one ordered chain pair's PAE block [n_A, n_B] (Kim 2024)."""
    good = pae_block[pae_block < LIS_PAE_CUTOFF]
    return float(np.mean((LIS_PAE_CUTOFF - good) / LIS_PAE_CUTOFF)) if good.size else 0.0


def _mean_rows(tm: np.ndarray, select: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[N] per-residue mean of tm[i, select[i]] for i in rows (0 elsewhere / when empty);
    tm [N, N] or a callable row -> values, select [N, N] bool."""
    out = np.zeros(len(select))
    for i in np.nonzero(rows)[0]:
        if select[i].any():
            values = tm(i) if callable(tm) else tm[i]
            out[i] = values[select[i]].mean()
    return out


def _contact_scores(pae, cb_plddt, dist, in_a, in_b) -> tuple[float, float]:
    """(pDockQ, pDockQ2) of the ordered pair (A, B)."""
    contacts = in_a[:, None] & in_b[None, :] & (dist <= PDOCKQ_CONTACT)        # [N, N]
    n = int(contacts.sum())
    if n == 0:
        return 0.0, 0.0
    members = sorted(set(np.nonzero(contacts.any(1))[0]) | set(np.nonzero(contacts.any(0))[0]))
    mean_plddt = float(cb_plddt[members].mean())
    mean_tm = float(tm_term(pae[contacts], PDOCKQ2_D0).sum()) / n
    return pdockq(mean_plddt, n), pdockq2(mean_plddt, mean_tm)


def _unique_numbers(numbers: np.ndarray, select: np.ndarray) -> tuple[int, int]:
    """(distinct residue numbers of the rows with any selected pair, of the selected columns)."""
    return (len(set(numbers[select.any(1)].tolist())),
            len(set(numbers[select.any(0)].tolist())))


def ordered_pair_scores(pae: np.ndarray, cb_plddt: np.ndarray, res: Residues, dist: np.ndarray,
                        a: str, b: str, pae_cutoff: float, dist_cutoff: float) -> dict:
    """Every score of the ordered pair (A aligned, B scored): pae [N, N] Å, cb_plddt [N],
    dist [N, N] Cβ distances. Returns the asym row's values plus per-residue arrays."""
    in_a, in_b = res.chain_ids == a, res.chain_ids == b                         # [N]
    nucleic = bool(np.isin(res.residue_names[in_a | in_b], list(NUCLEIC_RESIDUES)).any())
    n0chn = int(in_a.sum() + in_b.sum())
    d0chn = d0_of_length(n0chn, nucleic)
    def tm_chn(i):                       # row i of f(PAE, d0chn), only for rows of A
        return tm_term(pae[i], d0chn)
    valid = in_a[:, None] & in_b[None, :] & (pae < pae_cutoff)                 # [N, N]
    all_b = np.broadcast_to(in_b, pae.shape)
    iptm_byres = _mean_rows(tm_chn, all_b, in_a)                                # [N]
    chn_byres = _mean_rows(tm_chn, valid, in_a)
    nres1, nres2 = _unique_numbers(res.residue_numbers, valid)
    n0dom = nres1 + nres2
    d0dom = d0_of_length(n0dom, nucleic)
    dom_byres = _mean_rows(lambda i: tm_term(pae[i], d0dom), valid, in_a)
    n0res_byres = valid.sum(1)                                                  # [N]
    d0res_byres = d0_per_residue(n0res_byres, nucleic)                          # [N]
    res_byres = _mean_rows(lambda i: tm_term(pae[i], d0res_byres[i]), valid, in_a)
    best = int(np.argmax(res_byres))
    near = valid & (dist < dist_cutoff)
    dist1, dist2 = _unique_numbers(res.residue_numbers, near)
    pdq, pdq2 = _contact_scores(pae, cb_plddt, dist, in_a, in_b)
    return {"chain_1": a, "chain_2": b, "type": "asym",
            "ipsae": float(res_byres[best]), "ipsae_d0chn": float(chn_byres.max()),
            "ipsae_d0dom": float(dom_byres.max()), "iptm_d0chn": float(iptm_byres.max()),
            "pdockq": pdq, "pdockq2": pdq2, "lis": lis(pae[np.ix_(in_a, in_b)]),
            "n0res": int(n0res_byres[best]), "n0chn": n0chn, "n0dom": n0dom,
            "d0res": float(d0res_byres[best]), "d0chn": d0chn, "d0dom": d0dom,
            "nres1": nres1, "nres2": nres2, "dist1": dist1, "dist2": dist2,
            "pae_cutoff": float(pae_cutoff), "dist_cutoff": float(dist_cutoff),
            "byres": {"ipsae": res_byres, "ipsae_d0chn": chn_byres, "ipsae_d0dom": dom_byres,
                      "iptm_d0chn": iptm_byres, "n0res": n0res_byres, "d0res": d0res_byres}}


MAX_OF_ASYM = ("ipsae", "ipsae_d0chn", "ipsae_d0dom", "iptm_d0chn")


def max_row(hi: dict, lo: dict, ipsae_py_order: bool = False) -> dict:
    """The max row of an unordered pair from its two asym rows: `hi` = (B, A) with B > A,
    `lo` = (A, B); named (A, B) like ipsae.py's row. Ties take `hi`'s n0/d0.

    `ipsae_py_order`: reproduce ipsae.py v4 when chain B comes before chain A in the file:
    it takes the maximum before the (A, B) asym values exist (they are still 0 then), so its
    max row's ipSAE / ipSAE_d0chn / ipSAE_d0dom / ipTM_d0chn and n0/d0 are (B, A)'s even when
    (A, B)'s are larger. Off by default (protdp reports the true maximum)."""
    lo_seen = {k: 0.0 if ipsae_py_order else lo[k] for k in MAX_OF_ASYM}

    def side(key):                         # the row whose asym `key` value is the max
        return hi if max(hi[key], lo_seen[key]) == hi[key] else lo
    s_res, s_dom = side("ipsae"), side("ipsae_d0dom")
    return {"chain_1": lo["chain_1"], "chain_2": lo["chain_2"], "type": "max",
            "ipsae": s_res["ipsae"],
            "ipsae_d0chn": max(hi["ipsae_d0chn"], lo_seen["ipsae_d0chn"]),
            "ipsae_d0dom": s_dom["ipsae_d0dom"],
            "iptm_d0chn": max(hi["iptm_d0chn"], lo_seen["iptm_d0chn"]),
            "pdockq": hi["pdockq"], "pdockq2": max(hi["pdockq2"], lo["pdockq2"]),
            "lis": (hi["lis"] + lo["lis"]) / 2.0,
            "n0res": s_res["n0res"], "n0chn": hi["n0chn"], "n0dom": s_dom["n0dom"],
            "d0res": s_res["d0res"], "d0chn": hi["d0chn"], "d0dom": s_dom["d0dom"],
            "nres1": max(hi["nres2"], lo["nres1"]), "nres2": max(hi["nres1"], lo["nres2"]),
            "dist1": max(hi["dist2"], lo["dist1"]), "dist2": max(hi["dist1"], lo["dist2"]),
            "pae_cutoff": hi["pae_cutoff"], "dist_cutoff": hi["dist_cutoff"]}


def cb_distances(cb: np.ndarray) -> np.ndarray:
    """[N, 3] -> [N, N] Euclidean distances: sqrt((dx² + dy²) + dz²), the same sums in the
    same order as ipsae.py's ((a - b)²).sum(axis=2) without its [N, N, 3] temporary."""
    d2 = (cb[:, None, 0] - cb[None, :, 0]) ** 2
    for k in (1, 2):
        d2 += (cb[:, None, k] - cb[None, :, k]) ** 2
    return np.sqrt(d2)


def chain_pairs(chains: list[str]) -> list[tuple[str, str]]:
    """The unordered pairs (A, B), A < B, in ipsae.py's order: sorted by the text "A-B". Kept
    as tuples, never split from that text: mmCIF chain ids may contain "-" ("A-2")."""
    pairs = [(a, b) for a in chains for b in chains if a < b]
    return sorted(pairs, key=lambda p: (f"{p[0]}-{p[1]}", p))


def interface_scores(pae: np.ndarray, cb_plddt: np.ndarray, res: Residues,
                     pae_cutoff: float = DEFAULT_PAE_CUTOFF,
                     dist_cutoff: float = DEFAULT_DIST_CUTOFF,
                     ipsae_py_order: bool = False) -> list[dict]:
    """ipsae.py's rows for one complex: for each unordered pair {A, B} (`chain_pairs`) the asym
    rows (A, B) and (B, A), then the max row (A, B). pae [N, N] Å,
    cb_plddt [N] (the pLDDT at each residue's Cβ atom; per-residue pLDDT for AF2);
    `ipsae_py_order` see `max_row`."""
    pae = np.asarray(pae, dtype=float)
    cb_plddt = np.asarray(cb_plddt, dtype=float)
    n = len(res.chain_ids)
    if pae.shape != (n, n) or cb_plddt.shape != (n,) or res.cb.shape != (n, 3):
        raise ValueError(f"shapes: PAE {pae.shape}, pLDDT {cb_plddt.shape}, Cβ {res.cb.shape} "
                         f"for {n} residues")
    dist = cb_distances(np.asarray(res.cb, dtype=float))
    chains = res.chains
    rows = []
    for a, b in chain_pairs(chains):
        lo = ordered_pair_scores(pae, cb_plddt, res, dist, a, b, pae_cutoff, dist_cutoff)
        hi = ordered_pair_scores(pae, cb_plddt, res, dist, b, a, pae_cutoff, dist_cutoff)
        for row in (lo, hi):
            row.pop("byres")
        early = ipsae_py_order and chains.index(b) < chains.index(a)
        rows += [lo, hi, max_row(hi, lo, early)]
    return rows


def best_pair(rows: list[dict], key: str = "ipsae") -> dict | None:
    """The max row with the highest `key` (None without any pair)."""
    maxes = [r for r in rows if r["type"] == "max"]
    return max(maxes, key=lambda r: r[key]) if maxes else None
