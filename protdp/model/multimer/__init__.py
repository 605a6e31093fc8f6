"""The AlphaFold-Multimer network (Evans et al. 2021) beside the monomer modules it reuses:
its embedders (`embedders`), template stack (`template`), in-model MSA sampling (`msa`), the
model (`model`), its heads and ranking confidence (`heads`), and its training losses
(`losses`) with the chain permutation alignment (`permutation` on whole chains,
`crop_permutation` on a cropped complex)."""
