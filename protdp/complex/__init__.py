"""Complexes (AlphaFold-Multimer, Evans et al. 2021): complex FASTA inputs (`inputs`), the
species pairing of per-chain MSAs (`pairing`) and the merged, cropped model input features
(`features`), each reproducing DeepMind's AlphaFold v2.3.2 data pipeline
(`pipeline_multimer`, `feature_processing`, `msa_pairing`, `msa_identifiers`).

Floor 1.6 (docs/architecture.md): reads files through `protdp.data`, never imports the model.
"""
