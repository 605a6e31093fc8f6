"""Complexes through `protdp predict` (AlphaFold-Multimer, issue 32): inputs, per-chain MSAs
and the multimer model's inputs, one ensemble member.

With a multimer checkpoint (`protdp weights import` of `params_model_N_multimer_v3.npz`) the
batch input is read as complexes (`protdp.complex.inputs.read_complexes`: ColabFold 'A:B'
records, AlphaFold's one FASTA file per complex, or a folder of those); each complex becomes a
`Target` whose `extra["complex"]` is its `ComplexTarget` and whose sequence is the chains joined
with ':'. Per chain, the MSAs are those `protdp msa search --complexes` writes under
`<msa-dir>/<complex>_<chain id>/` (every database but the pairing one, merged), and the
pairing reads `<msa-dir>/<complex>_<chain id>/stockholm/<pairing db>.sto`; without an MSA
folder (or with --msa-mode single_sequence) every chain is its query alone (single-sequence
mode, which the gate flags). `protdp.complex.features.complex_features` builds AlphaFold's
multimer `np_example` (the same function `protdp complex features` calls), and the model
samples the MSA inside (AlphaFold-Multimer's in-model sampling, one sample per recycle,
seeded). Everything after the model (ranking by 0.8 ipTM + 0.2 pTM, the files, the gate with
ipTM / interface PAE, the review queue) is the monomer path's (`protdp.inference.predictor`).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch

from protdp.data.parse import Msa, parse_msa
from protdp.errors import InputError, ProtdpError
from protdp.fileio import sha256_file
from protdp.inference.targets import (Target, _assign_names, clean_sequence, find_msa_files,
                                      load_msa)
from protdp.inference.writers import safe_name
from protdp.complex.given_msas import given_complex_inputs
from protdp.complex.features import ChainInput, chain_msa_rows, complex_features
from protdp.complex.pair_modes import DEFAULT_PAIR_MODE, apply_pair_mode, needs_pairing_alignment
from protdp.complex.inputs import FASTA_SUFFIXES, ComplexTarget, chain_msa_names, read_complexes

PAIRING_DB = "uniprot"                   # the database whose Stockholm alignment is paired
COMPLEX_HINT = ("is a complex (ColabFold 'A:B' record): predict it with a multimer checkpoint "
                "(`protdp weights import` of params_model_N_multimer_v3.npz)")


def is_complex_record(raw_sequence: str) -> bool:
    return ":" in raw_sequence


def read_complex_targets(path: str | Path) -> tuple[list[Target], str]:
    """(one Target per complex, in input order; input_sha256 over every file read). A folder
    written by `protdp complex features` gives one Target per `<complex>/features.npz`
    (`protdp.inference.complex_features_input`: precomputed features, same prediction path)."""
    from protdp.data.safeio import split_suffix

    path = Path(path)
    from protdp.inference.complex_features_input import is_features_folder, read_features_targets
    if is_features_folder(path):
        return read_features_targets(path)
    complexes = read_complexes(path)
    targets = []
    for c in complexes:
        t = Target(c.index, c.complex_id, c.complex_id, ":".join(c.sequences), c.line,
                   error=c.error, extra={"complex": c, "source": c.path})
        targets.append(t)
    _assign_names(targets, path)          # file-name collisions of two complex ids
    if path.is_dir():
        digest = hashlib.sha256()
        for f in sorted(p for p in path.iterdir() if p.is_file()
                        and split_suffix(p)[1] in FASTA_SUFFIXES):
            digest.update(f"{f.name}\0{sha256_file(f)}\n".encode())
        return targets, digest.hexdigest()
    return targets, sha256_file(path)


def _query_msa(seq: str) -> Msa:
    return Msa([seq], np.zeros((1, len(seq)), np.uint8), ["query"])


def chain_inputs(t: ComplexTarget, msa_dir: Path | None, *, pairing_db: str = PAIRING_DB,
                 max_length: int, max_unknown_fraction: float,
                 pair_mode: str = DEFAULT_PAIR_MODE, user_msas: bool = True
                 ) -> tuple[list[ChainInput], list[Path]]:
    """Each chain's sequence, MSA (query first) and pairing alignment -> (ChainInputs, every
    MSA file read), restricted to `pair_mode` (`protdp.complex.pair_modes`). `msa_dir` None:
    every chain is its query alone. MSAs the user gave for the complex (ColabFold's
    `<complex>.a3m`, or `<complex>/paired/<chain>.a3m`: `protdp.complex.given_msas`) come
    first, paired rows as given; else the folders `protdp msa search --complexes` writes
    (always, with `user_msas` False). A
    chain whose MSA is missing or is not of its sequence is one InputError naming the complex
    and chain."""
    names = chain_msa_names(t)
    out, files_read = [], []
    seqs = {}
    for c in t.chains:
        try:
            seqs[c.chain_id] = clean_sequence(c.sequence, max_length=max_length,
                                              max_unknown_fraction=max_unknown_fraction)
        except InputError as exc:
            raise InputError(f"complex '{t.complex_id}' chain {c.chain_id}: {exc}",
                             path=t.path, line=c.line) from None
    given = (given_complex_inputs(msa_dir, safe_name(t.complex_id), list(seqs.items()))
             if msa_dir and user_msas else None)
    if given is not None:
        return apply_pair_mode(given[0], pair_mode), given[1]
    for c in t.chains:
        where = f"complex '{t.complex_id}' chain {c.chain_id}"
        seq = seqs[c.chain_id]
        if msa_dir is None:
            out.append(ChainInput(c.chain_id, seq, _query_msa(seq),
                                  None if t.is_homomer else _query_msa(seq), None))
            continue
        stem = safe_name(names[c.chain_id])
        found = find_msa_files(msa_dir, stem)
        files = [f for f in found if not f.name.startswith(f"{pairing_db}.")]
        if not files:
            hint = (f"only the pairing database '{pairing_db}', which pairs the chains but is "
                    "not their MSA: search e.g. UniRef90 too" if found
                    else "run `protdp msa search --complexes` first")
            raise InputError(f"{where}: no MSA under {msa_dir / stem} ({hint})",
                             path=t.path, line=c.line)
        msa = load_msa(files)
        if msa.query != seq:
            raise InputError(f"{where}: the MSA's query is not the chain's sequence",
                             path=files[0])
        uniprot = None
        if not t.is_homomer and needs_pairing_alignment(pair_mode):
            sto = msa_dir / stem / "stockholm" / f"{pairing_db}.sto"
            if not sto.is_file():
                raise InputError(f"{where}: no pairing alignment {sto} (search the "
                                 f"'{pairing_db}' database with --complexes)", path=t.path,
                                 line=c.line)
            uniprot = parse_msa(sto)
            files.append(sto)
        files_read += [f for f in files if f not in files_read]
        out.append(ChainInput(c.chain_id, seq, msa, uniprot, None))
    return apply_pair_mode(out, pair_mode), files_read


def malformed_species_note(report: dict) -> str:
    """One line naming UniProt-style row names whose species could not be read (not paired)."""
    from protdp.inference.writers import printable

    bad = {c: u for c, u in report.get("uniprot_msas", {}).items()
           if u["malformed_uniprot_names"]}
    return "; ".join(f"chain {c}: {u['malformed_uniprot_names']} UniProt-style row name(s) "
                     f"without a readable species (first: '{printable(u['first_malformed'])}'),"
                     f" left unpaired" for c, u in bad.items())


def complex_inputs(t: Target, msa_dir: Path | None, *, max_length: int,
                   max_unknown_fraction: float, pair_mode: str = DEFAULT_PAIR_MODE) -> dict:
    """`build_features` of a complex read from FASTA, or the precomputed features of one read
    from a `protdp complex features` folder (`complex_features_input.features_inputs`)."""
    if "features_npz" in t.extra:
        from protdp.inference.complex_features_input import features_inputs
        return features_inputs(t, max_length=max_length)   # rows as written: no pair mode
    return build_features(t.extra["complex"], msa_dir, max_length=max_length,
                          max_unknown_fraction=max_unknown_fraction, pair_mode=pair_mode)


def build_features(t: ComplexTarget, msa_dir: Path | None, *, max_length: int,
                   max_unknown_fraction: float, pair_mode: str = DEFAULT_PAIR_MODE) -> dict:
    """The model input of one complex: {"features" (numpy np_example), "chains" [(id, seq)] in
    residue order, "files" (MSA files read), "report" (pairing), "msa_depth" (the shallowest
    chain's rows in the model's MSA, paired and unpaired), "coverage" [L] (rows per residue
    there), "note"}."""
    inputs, files = chain_inputs(t, msa_dir, max_length=max_length,
                                 max_unknown_fraction=max_unknown_fraction, pair_mode=pair_mode)
    total = sum(len(c.sequence) for c in inputs)
    if total > max_length:
        raise InputError(f"complex '{t.complex_id}': {total} residues in all exceeds the "
                         f"configured limit {max_length} (--max-length)", path=t.path,
                         line=t.line)
    try:
        cf = complex_features(inputs)
    except ValueError as exc:
        raise InputError(f"complex '{t.complex_id}': {exc}", path=t.path, line=t.line) from None
    by_id = {c.chain_id: c for c in inputs}
    order = [ch["chain_id"] for ch in cf.report["chains"]]       # residue (asym) order
    chains = [(cid, by_id[cid].sequence) for cid in order]
    depths, coverage = chain_msa_rows(cf.features)      # the rows the model gets (pair mode)
    return {"features": cf.features, "chains": chains, "files": files, "report": cf.report,
            "msa_depth": min(depths), "coverage": coverage.astype(int).tolist(),
            "note": malformed_species_note(cf.report), "records": chain_records(t)}


def chain_records(t: ComplexTarget) -> dict[str, dict]:
    """AlphaFold-Multimer's chain id map: {chain id: {"description" (the FASTA record's, or
    '<complex> chain <id>' for a ColabFold 'A:B' record), "sequence"}}, input order."""
    return {c.chain_id: {"description": c.description, "sequence": c.sequence}
            for c in t.chains}


@torch.no_grad()
def run_complex_member(model: torch.nn.Module, features: dict, device: torch.device, *,
                       seed: int, num_recycles: int | None) -> dict:
    """One multimer prediction (the model samples its MSA with a generator seeded `seed`) ->
    the monomer path's prediction dict plus ipTM, ranking confidence, the chain-pair ipTM /
    PAE matrices [C, C] and the interface PAE."""
    batch = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in features.items()}
    gen = torch.Generator(device=device).manual_seed(int(seed))
    t0 = time.perf_counter()
    try:
        out = model(batch, num_recycles=num_recycles, generator=gen)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as exc:    # one complex's failure is its row, never the batch's end
        raise ProtdpError(f"the multimer model failed on this complex: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                          ) from None

    def arr(x):
        return x.float().cpu().numpy()

    ipae = out.get("interface_pae")
    ipae = None if ipae is None or not torch.isfinite(torch.as_tensor(ipae)).all() else float(ipae)
    return {"positions": arr(out["final_atom_positions"]),           # [L, 37, 3]
            "atom_mask": arr(out["final_atom_mask"]),                # [L, 37]
            "plddt": arr(out["plddt"]),                              # [L]
            "pae": arr(out["pae"]),                                  # [L, L]
            "ptm": float(out["ptm"]), "iptm": float(out["iptm"]),
            "chain_pair_iptm": arr(out["chain_pair_iptm"]),          # [C, C]
            "chain_pair_pae": arr(out["chain_pair_pae"]),            # [C, C]
            "chain_pair_actifptm": arr(out["chain_pair_actifptm"]),  # [C, C] (issue 43)
            "interface_pae": ipae,
            "num_recycles": int(out["num_recycles"]), "chunk_size": None, "oom_retries": [],
            "predicted_peak_gib": None, "early_stop": None,
            "seconds": round(time.perf_counter() - t0, 3)}


def run_complex_ensemble(models: list, features: dict, device: torch.device, config,
                         member_names: list[dict]) -> tuple[dict, dict]:
    """Every (multimer model, seed) prediction of one complex (`ensemble.members`: AlphaFold's
    model_1..5 x seeds) -> ({name: prediction}, timings.json); `member_names` per model
    (`model_names.describe_members`)."""
    from protdp.inference.ensemble import members
    from protdp.inference.model_names import colabfold_tag
    from protdp.inference.ranking import model_numbers

    preds, timings = {}, {}
    numbers = model_numbers([m.path for m in models])        # imported model_N keeps its N
    for mem in members(len(models), config.seed, config.num_seeds, numbers):
        loaded = models[mem.model_index]
        pred = run_complex_member(loaded.model, features, device, seed=mem.seed,
                                  num_recycles=config.num_recycles)
        names = member_names[mem.model_index]
        pred.update(model_index=mem.model_index, seed=mem.seed, **names,
                    colabfold_tag=colabfold_tag(mem.name, names["model_type"]),
                    msa_rows_used=int(features["num_alignments"]),
                    checkpoint_sha256=loaded.sha256)
        timings[f"predict_and_compile_{mem.name}"] = pred["seconds"]
        preds[mem.name] = pred
    return preds, timings


# scores.json keys a complex adds (also handed to the review queue)
COMPLEX_SCORE_KEYS = ("chains", "iptm", "ranking_confidence", "chain_pair_iptm",
                      "interface_pae", "chain_pair_pae", "interface_scores", "best_interface")


def interface_rows(chains: list[tuple[str, str]], top: dict) -> list[dict]:
    """The top prediction's ipSAE / pDockQ / pDockQ2 / LIS / actifpTM rows
    (`protdp.interface.complex`), computed once and kept in `top`."""
    from protdp.interface.complex import complex_interface_rows

    if "interface_scores" not in top:
        top["interface_scores"] = complex_interface_rows(
            chains, top["positions"], top["plddt"], top["pae"], top.get("chain_pair_actifptm"))
    return top["interface_scores"]


def complex_scores(chains: list[tuple[str, str]], top: dict) -> dict:
    """The top-ranked prediction's complex scores for scores.json (`protdp complex predict`'s
    `confidence_json`): chain ranges in residue order, ipTM, ranking confidence, the chain-pair
    ipTM / PAE matrices keyed by chain id, the interface PAE."""
    from protdp.complex.outputs import confidence_json

    doc = confidence_json(chains, top["plddt"], {**top, "ranking_confidence":
                                                 0.8 * top["iptm"] + 0.2 * top["ptm"]},
                          with_pae=False)            # the [L, L] PAE: not a score key
    from protdp.interface.complex import best_interface

    rows = interface_rows(chains, top)
    doc.update(interface_scores=rows, best_interface=best_interface(rows))
    return {k: doc[k] for k in COMPLEX_SCORE_KEYS}
