"""Evoformer + IPA structure model (AF2 supplement); `build_model(config)` is the entry point."""

from protdp.model.config import LossConfig, ModelConfig
from protdp.model.model import AlphaFoldModel, build_model, sample_num_recycles

__all__ = ["AlphaFoldModel", "LossConfig", "ModelConfig", "build_model", "sample_num_recycles"]
