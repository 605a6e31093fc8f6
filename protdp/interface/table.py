"""ipsae.py's text table of interface rows (its `_PAE_DIST.txt` columns and number formats:
six decimals for ipSAE / ipTM, four for pDockQ, pDockQ2 and LIS, two for d0), and the rows with
the predicting tool's own ipTM (`ipTM_af`) attached as ipsae.py attaches it."""

from __future__ import annotations

from protdp.interface.readers import Prediction
from protdp.interface.scores import interface_scores

HEADER = ("Chn1 Chn2  PAE Dist  Type   ipSAE    ipSAE_d0chn ipSAE_d0dom  ipTM_af  ipTM_d0chn"
          "     pDockQ     pDockQ2    LIS       n0res  n0chn  n0dom   d0res   d0chn   d0dom  "
          "nres1   nres2   dist1   dist2  Model")


def with_tool_iptm(rows: list[dict], pred: Prediction) -> list[dict]:
    """Each row plus `iptm_af`: AF2 / ColabFold / protdp's whole-complex ipTM (-1 if absent);
    AF3's chain-pair ipTM; Boltz's pair ipTM (the max row: the larger of both directions;
    AF3's max row: the (B, A) entry, as ipsae.py prints it)."""
    out = []
    for r in rows:
        a, b = r["chain_1"], r["chain_2"]
        if r["type"] == "asym":
            v = pred.iptm.get((a, b), -1.0)
        elif pred.format == "boltz":
            v = max(pred.iptm.get((a, b), 0.0), pred.iptm.get((b, a), 0.0))
        else:
            v = pred.iptm.get((b, a), -1.0)
        out.append({**r, "iptm_af": v})
    return out


def prediction_rows(pred: Prediction, pae_cutoff: float, dist_cutoff: float,
                    ipsae_py_order: bool = False) -> list[dict]:
    rows = interface_scores(pred.pae, pred.cb_plddt, pred.residues, pae_cutoff, dist_cutoff,
                            ipsae_py_order)
    return with_tool_iptm(rows, pred)


def _cutoff(x: float) -> str:
    s = str(int(x))
    return "0" + s if x < 10 else s


def format_table(rows: list[dict], model: str) -> str:
    lines = ["", HEADER]
    for k, r in enumerate(rows):
        lines.append(
            f"{r['chain_1']}    {r['chain_2']}     {_cutoff(r['pae_cutoff']):3}  "
            f"{_cutoff(r['dist_cutoff']):3}  {r['type']:5} {r['ipsae']:8.6f}    "
            f"{r['ipsae_d0chn']:8.6f}    {r['ipsae_d0dom']:8.6f}    {r.get('iptm_af', -1.0):5.3f}"
            f"    {r['iptm_d0chn']:8.6f}    {r['pdockq']:8.4f}   {r['pdockq2']:8.4f}   "
            f"{r['lis']:8.4f}   {r['n0res']:5d}  {r['n0chn']:5d}  {r['n0dom']:5d}  "
            f"{r['d0res']:6.2f}  {r['d0chn']:6.2f}  {r['d0dom']:6.2f}  {r['nres1']:5d}   "
            f"{r['nres2']:5d}   {r['dist1']:5d}   {r['dist2']:5d}   {model}")
        if r["type"] == "max":
            lines.append("")
    return "\n".join(lines) + "\n"
