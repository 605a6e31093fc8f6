"""protdp: data-parallel training of Evoformer-style protein structure models and
gated batch structure prediction. Importing the package has no side effects."""

__version__ = "0.1.0"
