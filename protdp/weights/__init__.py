"""AlphaFold2 / OpenFold parameter import and export, and the comparison against AlphaFold's own
outputs (`protdp weights import|export|compare`, `protdp.weights.cli`).

- `alphafold`: DeepMind's npz naming <-> protdp state dicts, model configuration from shapes;
- `openfold`: OpenFold's torch state-dict naming <-> protdp;
- `store`: reading/writing parameter files and imported checkpoints (model.pt + provenance.json);
- `compare`: AlphaFold's processed features and outputs (fixture layout) vs protdp's outputs.
"""
