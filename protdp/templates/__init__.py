"""Structural templates as AlphaFold v2.3.2 finds and featurizes them (issue 31): `search`
(pyhmmer, AF2's hmmsearch route), `hits` (its -A Stockholm -> hits), `mmcif` (gemmi),
`featurize` (AF2's HmmsearchHitFeaturizer), `run` (files beside the MSAs), `inputs` (model
inputs, custom templates for predict), `training` (stored hits, AF2's training sampling).
The model side is `protdp.model.template`."""
