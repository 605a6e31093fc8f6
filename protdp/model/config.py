"""Model configuration (Megatron-core style: one dataclass, one-line docstring per field,
validation in `__post_init__`). YAML files in `configs/model/` map 1:1 onto it via
`protdp.config.load_config(ModelConfig, path)`.

Defaults are the AF2 monomer sizes of the supplement (Table/§1.5-1.8 hyper-parameters); the
tiny/small YAMLs shrink the channel counts and depths only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protdp.data.bounds import MAX_BLOCKS, MAX_CHANNELS, MAX_MSA_ROWS, MAX_RECYCLES, MAX_TEMPLATES


@dataclass
class LossConfig:
    """Loss weights and settings (AF2 supplement §1.9, Eq. 7 weights)."""

    fape_weight: float = 0.5
    """Weight of the final-layer all-atom FAPE (AF2 L_FAPE weight 0.5)."""
    aux_weight: float = 0.5
    """Weight of the auxiliary loss: backbone FAPE averaged over layers + chi torsion (AF2 0.5)."""
    distogram_weight: float = 0.3
    """Weight of the distogram cross-entropy (AF2 0.3)."""
    masked_msa_weight: float = 2.0
    """Weight of the masked-MSA cross-entropy (AF2 2.0)."""
    plddt_weight: float = 0.01
    """Weight of the pLDDT cross-entropy (AF2 0.01)."""
    pae_weight: float = 0.01
    """Weight of the PAE (predicted aligned error) loss; only used when the head is on (AF2 0.01)."""
    fape_clamp: float | None = 10.0
    """FAPE distance clamp in Å (None = unclamped)."""
    fape_length_scale: float = 10.0
    """FAPE normalisation length Z in Å."""
    fape_eps: float = 1e-4
    """Epsilon (Å²) under the square root of the FAPE distance."""
    angle_norm_weight: float = 0.02
    """Weight of the torsion angle-norm penalty inside the torsion loss (Alg. 27)."""
    plddt_min_resolution: float = 0.1
    """pLDDT, PAE and experimentally-resolved losses only for structures with resolution >= this
    (Å; NaN resolution always counts)."""
    plddt_max_resolution: float = 3.0
    """... and resolution <= this (Å)."""
    experimentally_resolved_weight: float = 0.0
    """Weight of the experimentally-resolved loss (AF2: 0 in initial training, 0.01 fine-tuning)."""
    violation_weight: float = 0.0
    """Weight of the structural violation loss (AF2: 0 in initial training, 1.0 fine-tuning)."""
    violation_tolerance_factor: float = 12.0
    """Bond lengths/angles violate beyond this many literature standard deviations."""
    clash_overlap_tolerance: float = 1.5
    """Atoms clash when closer than the sum of their van der Waals radii minus this (Å)."""

    def __post_init__(self):
        for name in ("fape_weight", "aux_weight", "distogram_weight", "masked_msa_weight",
                     "plddt_weight", "pae_weight", "angle_norm_weight",
                     "experimentally_resolved_weight", "violation_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"loss.{name} must be >= 0, got {getattr(self, name)}")
        if self.fape_clamp is not None and self.fape_clamp <= 0:
            raise ValueError(f"loss.fape_clamp must be > 0 or null, got {self.fape_clamp}")
        if self.fape_length_scale <= 0:
            raise ValueError(f"loss.fape_length_scale must be > 0, got {self.fape_length_scale}")


@dataclass
class ModelConfig:
    """Evoformer + structure module sizes, regularisation, recycling and memory options."""

    # --- trunk sizes --------------------------------------------------------------------
    c_m: int = 256
    """MSA representation channels."""
    c_z: int = 128
    """Pair representation channels."""
    c_s: int = 384
    """Single representation channels (Evoformer output, structure module)."""
    n_blocks: int = 48
    """Number of Evoformer blocks."""
    msa_heads: int = 8
    """Heads of MSA row/column attention."""
    c_hidden_msa_att: int = 32
    """Per-head channels of MSA row/column attention."""
    pair_heads: int = 4
    """Heads of triangle attention."""
    c_hidden_tri_att: int = 32
    """Per-head channels of triangle attention."""
    c_hidden_tri_mul: int = 128
    """Hidden channels of the triangle multiplicative update."""
    c_hidden_opm: int = 32
    """Hidden channels of the outer product mean."""
    transition_n: int = 4
    """Expansion factor of MSA and pair transitions."""
    relpos_k: int = 32
    """Relative position clip (Alg. 4): 2k+1 one-hot bins."""
    msa_dropout: float = 0.15
    """Row-shared dropout after MSA row attention."""
    pair_dropout: float = 0.25
    """Row-/column-shared dropout after triangle updates and attentions."""

    # --- extra MSA stack (Alg. 18-19) ----------------------------------------------------
    extra_msa: bool = False
    """Run the extra-MSA stack on MSA rows beyond `max_msa_clusters`."""
    max_msa_clusters: int = 512
    """MSA rows given to the main stack when the extra-MSA stack splits the MSA."""
    c_e: int = 64
    """Extra-MSA representation channels."""
    n_extra_blocks: int = 4
    """Number of extra-MSA stack blocks."""
    c_hidden_extra_att: int = 8
    """Per-head channels of extra-MSA row/global column attention."""

    # --- templates (Alg. 16-17, §1.7.1; AF2 `model.embeddings_and_evoformer.template`) ---------
    templates: bool = False
    """Embed structural templates (pair stack + pointwise attention + torsion MSA rows)."""
    c_t: int = 64
    """Template pair channels (AF2 triangle_attention_ending_node.value_dim)."""
    template_pair_blocks: int = 2
    """Template pair stack blocks (Alg. 16)."""
    template_tri_heads: int = 4
    """Heads of the template triangle attention."""
    c_hidden_template_tri_att: int = 16
    """Per-head channels of the template triangle attention (AF2 key_dim 64 / 4 heads)."""
    c_hidden_template_tri_mul: int = 64
    """Hidden channels of the template triangle multiplicative update."""
    template_transition_n: int = 2
    """Expansion factor of the template pair transition."""
    template_att_heads: int = 4
    """Heads of the template pointwise attention (Alg. 17)."""
    c_hidden_template_att: int = 16
    """Per-head channels of the template pointwise attention (AF2 key_dim 64 / 4 heads)."""
    template_torsion_angles: bool = True
    """Append the templates' torsion-angle rows to the MSA (AF2 embed_torsion_angles)."""
    template_unit_vector: bool = False
    """Backbone unit vectors in the template pair features (AF2 use_template_unit_vector)."""
    template_dgram_bins: int = 39
    """Template pseudo-beta distogram bins."""
    template_dgram_min: float = 3.25
    """First template distogram bin edge (Å)."""
    template_dgram_max: float = 50.75
    """Last template distogram bin edge (Å)."""
    max_templates: int = 4
    """Templates per target fed to the model (AF2 max_templates)."""
    template_dropout: float = 0.25
    """Row-/column-shared dropout in the template pair stack."""

    # --- structure module (Alg. 20-23) ---------------------------------------------------
    c_sm: int | None = None
    """Structure-module channels (AF2 structure_module.num_channel; `initial_projection` maps
    the single representation to it); null = c_s."""
    sm_layers: int = 8
    """Structure module layers (shared weights)."""
    ipa_heads: int = 12
    """Invariant point attention heads."""
    c_ipa: int = 16
    """Per-head scalar query/key channels of IPA (AF2 num_scalar_qk)."""
    c_ipa_v: int | None = None
    """Per-head scalar value channels of IPA (AF2 num_scalar_v); null = c_ipa."""
    ipa_qk_points: int = 4
    """Query/key points per head in IPA."""
    ipa_v_points: int = 8
    """Value points per head in IPA."""
    sm_transition_layers: int = 3
    """Linear layers of the structure-module transition."""
    sm_dropout: float = 0.1
    """Dropout in the structure module."""
    c_resnet: int = 128
    """Hidden channels of the torsion-angle resnet (Alg. 20 lines 11-14: 7 torsions)."""
    n_resnet_blocks: int = 2
    """Residual blocks of the torsion-angle resnet."""
    position_scale: float = 10.0
    """Backbone translations are predicted in nm and scaled to Å by this factor."""

    # --- heads ---------------------------------------------------------------------------
    distogram_bins: int = 64
    """Distogram bins (first/last are open-ended)."""
    distogram_min: float = 2.3125
    """First distogram bin edge (Å)."""
    distogram_max: float = 21.6875
    """Last distogram bin edge (Å)."""
    plddt_bins: int = 50
    """pLDDT bins over [0, 1]."""
    c_plddt: int = 128
    """Hidden channels of the pLDDT head."""
    pae_head: bool = False
    """Predict aligned error (PAE) and pTM."""
    pae_bins: int = 64
    """PAE bins."""
    pae_max: float = 31.0
    """Last PAE bin edge (Å)."""

    # --- recycling -----------------------------------------------------------------------
    num_recycles: int = 3
    """Recycling iterations at inference (and in training when none is sampled)."""
    max_recycles: int = 3
    """Upper bound for the number of recycles sampled per training step."""
    recycle_min_bin: float = 3.25
    """First recycling distance bin edge (Alg. 32, Å)."""
    recycle_max_bin: float = 20.75
    """Last recycling distance bin edge (Å)."""
    recycle_bins: int = 15
    """Recycling distance bins."""

    # --- memory and precision ------------------------------------------------------------
    recompute: bool = False
    """Recompute each Evoformer block in backward (torch.utils.checkpoint)."""
    chunk_size: int | None = None
    """Chunk attention/transitions over rows with this many rows at a time (None = no chunking)."""
    bf16: bool = False
    """Run the trunk under bf16 autocast (CPU or CUDA); structure module and losses stay fp32."""
    attention_backend: str = "auto"
    """Biased-attention kernel: auto | explicit | sdpa | recompute | lowmem (protdp.model.attention)."""

    def _check_upper_bounds(self, positive: tuple[str, ...]) -> None:
        """Sizes a (possibly hostile) checkpoint declares, bounded before any module is built
        (protdp.data.bounds: a config of 10^7 blocks is refused in microseconds)."""
        bounds = {"n_blocks": MAX_BLOCKS, "n_extra_blocks": MAX_BLOCKS, "sm_layers": MAX_BLOCKS,
                  "template_pair_blocks": MAX_BLOCKS, "n_resnet_blocks": MAX_BLOCKS,
                  "sm_transition_layers": MAX_BLOCKS, "num_recycles": MAX_RECYCLES,
                  "max_recycles": MAX_RECYCLES, "max_templates": MAX_TEMPLATES,
                  "max_msa_clusters": MAX_MSA_ROWS}
        for name in positive + ("n_blocks", "n_extra_blocks", "num_recycles", "max_recycles",
                                "template_pair_blocks", "c_sm", "c_ipa_v", "chunk_size"):
            value, bound = getattr(self, name), bounds.get(name, MAX_CHANNELS)
            if name == "chunk_size":
                bound = MAX_MSA_ROWS
            if isinstance(value, int) and value > bound:
                raise ValueError(f"{name} {value} is above the bound {bound} "
                                 "(protdp.data.bounds)")

    @property
    def sm_channels(self) -> int:
        """Structure-module width: c_sm, or c_s when null."""
        return self.c_sm or self.c_s

    loss: LossConfig = field(default_factory=LossConfig)
    """Loss weights and settings."""

    def __post_init__(self):
        if isinstance(self.loss, dict):
            self.loss = LossConfig(**self.loss)
        positive = ("c_m", "c_z", "c_s", "msa_heads", "c_hidden_msa_att", "pair_heads",
                    "c_hidden_tri_att", "c_hidden_tri_mul", "c_hidden_opm", "transition_n",
                    "relpos_k", "max_msa_clusters", "c_e", "sm_layers", "ipa_heads", "c_ipa",
                    "ipa_qk_points", "ipa_v_points", "sm_transition_layers", "c_resnet",
                    "n_resnet_blocks",
                    "distogram_bins", "plddt_bins", "c_plddt", "pae_bins", "recycle_bins",
                    "c_hidden_extra_att", "c_t", "template_tri_heads",
                    "c_hidden_template_tri_att", "c_hidden_template_tri_mul",
                    "template_transition_n", "template_att_heads", "c_hidden_template_att",
                    "template_dgram_bins", "max_templates")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("n_blocks", "n_extra_blocks", "num_recycles", "max_recycles",
                     "template_pair_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        self._check_upper_bounds(positive)
        for name in ("msa_dropout", "pair_dropout", "sm_dropout", "template_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.c_ipa_v is not None and (not isinstance(self.c_ipa_v, int)
                                         or isinstance(self.c_ipa_v, bool) or self.c_ipa_v <= 0):
            raise ValueError(f"c_ipa_v must be a positive integer or null, got {self.c_ipa_v!r}")
        if self.c_sm is not None and (not isinstance(self.c_sm, int) or isinstance(self.c_sm, bool)
                                      or self.c_sm <= 0):
            raise ValueError(f"c_sm must be a positive integer or null, got {self.c_sm!r}")
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int)
                                            or self.chunk_size <= 0):
            raise ValueError(f"chunk_size must be a positive integer or null, got {self.chunk_size!r}")
        from protdp.model.attention import BACKENDS
        if self.attention_backend not in BACKENDS:
            raise ValueError(f"attention_backend must be one of {BACKENDS}, "
                             f"got {self.attention_backend!r}")
        if not self.distogram_min < self.distogram_max:
            raise ValueError("distogram_min must be < distogram_max")
        if not self.recycle_min_bin < self.recycle_max_bin:
            raise ValueError("recycle_min_bin must be < recycle_max_bin")
        if self.position_scale <= 0:
            raise ValueError(f"position_scale must be > 0, got {self.position_scale}")
