"""Other tools' predictions (ColabFold, AlphaFold2, AlphaFold 3, Boltz) through protdp's gate
and review queue (`protdp gate`)."""
