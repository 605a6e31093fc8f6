"""The README "Predict a proteome" recipe run on real chains of the shared data, with the
shared AlphaFold2 reference weights (imported with `protdp weights import`) and with a small
checkpoint trained on the shared data (`--checkpoint`), every promised output checked.

For each weight set, `protdp predict` (the CLI, as a user runs it) predicts the chains with
their real MSAs (links into ../shared/data/msa, merged per chain as `--msa-dir DIR/<id>/`),
an ensemble of seeds, early stop, `--sort-queries-by-length` and `--relax`; then every file
of the README's output table is read back (json, numpy, gemmi, Biopython, PNG headers), the
ranking is recomputed from the result files, the review queue is opened and counted, and the
relaxation of each top-ranked model is reported (clashes and peptide-bond violations before /
after, heavy-atom and Cα RMSD moved, AlphaFold's 1 Å safety check). Cα lDDT / RMSD against the
experimental chain say whether the predictions are protein-like.

    python benchmarks/proteome_run.py --checkpoint RUN_OR_ITER_DIR [--af2-params NPZ]
        -> benchmarks/results/proteome_run.json
"""
