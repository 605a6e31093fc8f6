"""One AlphaFold-Multimer recycling pass up to the single / pair / MSA representations,
written out in float64 numpy directly from the equations of DeepMind's AlphaFold v2.3.2
(`modules_multimer.EmbeddingsAndEvoformer`, `TemplateEmbedding`, `SingleTemplateEmbedding`,
`TemplateEmbeddingIteration`, `template_embedding_1d`; `modules.EvoformerIteration` with the
outer product mean first, the fused triangle multiplication of v3, `Attention`,
`GlobalAttention`, `Transition`, `OuterProductMean`) on AlphaFold's own flat parameter names.

It shares no model code with protdp: only the template / chi input features (checked against
their own numpy formulas in the tests) and the relative chain one-hot come from protdp. Used by
tests/test_multimer_model.py to check protdp's trunk pass against this transcription.
"""

from __future__ import annotations

import numpy as np

EVO = "alphafold/alphafold_iteration/evoformer/"
TEMPLATE = EVO + "template_embedding/"
SINGLE = TEMPLATE + "single_template_embedding/"
TEMPLATE_ITER = SINGLE + "template_embedding_iteration/"
LN_EPS = 1e-5                     # common_modules.LayerNorm
MASK_VALUE = -1e9                 # modules._SOFTMAX_MASK
OPM_EPS = 1e-3                    # OuterProductMean normalisation


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


class AlphaFoldTrunk:
    """params: AlphaFold's flat npz {name: array}; a stacked (layer_stack) parameter is read
    at `block`."""

    def __init__(self, params):
        self.params = {k: np.asarray(v, np.float64) for k, v in params.items()}

    def p(self, name, block=None):
        v = self.params[name]
        return v if block is None else v[block]

    def layer_norm(self, x, name, block=None):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return ((x - mu) / np.sqrt(var + LN_EPS) * self.p(name + "//scale", block)
                + self.p(name + "//offset", block))

    def linear(self, x, name, block=None, scalar_input=False):
        w, b = self.p(name + "//weights", block), self.p(name + "//bias", block)
        if scalar_input:                                  # Linear(num_input_dims=0)
            return x[..., None] * w + b
        return np.tensordot(x, w, axes=([x.ndim - 1], [0])) + b

    def attention(self, x, name, block, mask, pair_bias=None):
        """`Attention` with gating: x [B, Q, C], mask broadcastable to [B, H, Q, K]."""
        qw = self.p(name + "query_w", block)
        q = np.einsum("bqa,ahc->bqhc", x, qw) * qw.shape[-1] ** -0.5
        k = np.einsum("bka,ahc->bkhc", x, self.p(name + "key_w", block))
        v = np.einsum("bka,ahc->bkhc", x, self.p(name + "value_w", block))
        logits = np.einsum("bqhc,bkhc->bhqk", q, k)
        if pair_bias is not None:
            logits = logits + pair_bias[None]
        w = _softmax(np.where(mask > 0, logits, MASK_VALUE))
        out = np.einsum("bhqk,bkhc->bqhc", w, v)
        gate = _sigmoid(np.einsum("bqc,chv->bqhv", x, self.p(name + "gating_w", block))
                        + self.p(name + "gating_b", block))
        return (np.einsum("bqhc,hco->bqo", out * gate, self.p(name + "output_w", block))
                + self.p(name + "output_b", block))

    def global_attention(self, x, name, block, mask):
        """`GlobalAttention`: x [B(res), K(seq), C], mask [B, K]."""
        qw = self.p(name + "query_w", block)
        v = np.einsum("bka,ac->bkc", x, self.p(name + "value_w", block))
        k = np.einsum("bka,ac->bkc", x, self.p(name + "key_w", block))
        q_avg = (mask[..., None] * x).sum(1) / (mask.sum(1)[:, None] + 1e-10)
        q = np.einsum("ba,ahc->bhc", q_avg, qw) * qw.shape[-1] ** -0.5
        w = _softmax(np.where(mask[:, None, :] > 0, np.einsum("bhc,bkc->bhk", q, k), MASK_VALUE))
        avg = np.einsum("bhk,bkc->bhc", w, v)
        gate = _sigmoid(np.einsum("bqc,chv->bqhv", x, self.p(name + "gating_w", block))
                        + self.p(name + "gating_b", block))
        return (np.einsum("bqhc,hco->bqo", avg[:, None] * gate, self.p(name + "output_w", block))
                + self.p(name + "output_b", block))

    def transition(self, x, name, block):
        h = np.maximum(self.linear(self.layer_norm(x, name + "/input_layer_norm", block),
                                   name + "/transition1", block), 0.0)
        return self.linear(h, name + "/transition2", block)

    def triangle_multiplication(self, z, name, block, equation, mask):
        """Fused (v3) `TriangleMultiplication`: projection / gate columns [:c] left, [c:] right."""
        x = self.layer_norm(z, name + "/left_norm_input", block)
        proj = mask[..., None] * self.linear(x, name + "/projection", block)
        proj = proj * _sigmoid(self.linear(x, name + "/gate", block))
        c = proj.shape[-1] // 2
        out = np.einsum(equation, proj[..., :c], proj[..., c:])
        out = self.linear(self.layer_norm(out, name + "/center_norm", block),
                          name + "/output_projection", block)
        return out * _sigmoid(self.linear(x, name + "/gating_linear", block))

    def triangle_attention(self, z, name, block, mask, per_column):
        if per_column:
            z, mask = z.swapaxes(0, 1), mask.swapaxes(0, 1)
        x = self.layer_norm(z, name + "/query_norm", block)
        bias = np.einsum("qkc,ch->hqk", x, self.p(name + "//feat_2d_weights", block))
        out = self.attention(x, name + "/attention//", block, mask[:, None, None, :], bias)
        return out.swapaxes(0, 1) if per_column else out

    def pair_stack_block(self, z, name, block, mask):
        """The pair updates shared by the Evoformer and the template stack."""
        z = z + self.triangle_multiplication(z, name + "triangle_multiplication_outgoing", block,
                                             "ikc,jkc->ijc", mask)
        z = z + self.triangle_multiplication(z, name + "triangle_multiplication_incoming", block,
                                             "kjc,kic->ijc", mask)
        z = z + self.triangle_attention(z, name + "triangle_attention_starting_node", block,
                                        mask, False)
        z = z + self.triangle_attention(z, name + "triangle_attention_ending_node", block,
                                        mask, True)
        return z + self.transition(z, name + "pair_transition", block)

    def evoformer_block(self, m, z, msa_mask, pair_mask, name, block, extra):
        """`EvoformerIteration`, outer_product_mean.first (multimer)."""
        opm = name + "outer_product_mean"
        x = self.layer_norm(m, opm + "/layer_norm_input", block)
        left = msa_mask[..., None] * self.linear(x, opm + "/left_projection", block)
        right = msa_mask[..., None] * self.linear(x, opm + "/right_projection", block)
        outer = (np.einsum("aic,aje,cef->ijf", left, right, self.p(opm + "//output_w", block))
                 + self.p(opm + "//output_b", block))
        z = z + outer / (OPM_EPS + np.einsum("ai,aj->ij", msa_mask, msa_mask)[..., None])
        row = name + "msa_row_attention_with_pair_bias"
        bias = np.einsum("qkc,ch->hqk", self.layer_norm(z, row + "/feat_2d_norm", block),
                         self.p(row + "//feat_2d_weights", block))
        m = m + self.attention(self.layer_norm(m, row + "/query_norm", block),
                               row + "/attention//", block, msa_mask[:, None, None, :], bias)
        if extra:
            col = name + "msa_column_global_attention"
            x = self.layer_norm(m.swapaxes(0, 1), col + "/query_norm", block)
            m = m + self.global_attention(x, col + "/attention//", block, msa_mask.T).swapaxes(0, 1)
        else:
            col = name + "msa_column_attention"
            x = self.layer_norm(m.swapaxes(0, 1), col + "/query_norm", block)
            m = m + self.attention(x, col + "/attention//", block,
                                   msa_mask.T[:, None, None, :]).swapaxes(0, 1)
        m = m + self.transition(m, name + "msa_transition", block)
        return m, self.pair_stack_block(z, name, block, pair_mask)

    def template_pair(self, z, pair_inputs, pair_mask):
        """`TemplateEmbedding`: pair_inputs per template, the 8 non-query features of
        `construct_input` as [L, L, d] arrays (d = 1 for the scalar ones)."""
        total = 0.0
        for feats in pair_inputs:
            act = self.linear(self.layer_norm(z, SINGLE + "query_embedding_norm"),
                              SINGLE + "template_pair_embedding_8")
            for i, x in enumerate(feats):
                scalar = x.shape[-1] == 1
                act = act + self.linear(x[..., 0] if scalar else x,
                                        SINGLE + f"template_pair_embedding_{i}",
                                        scalar_input=scalar)
            for b in range(self.p(TEMPLATE_ITER + "pair_transition/transition1//bias").shape[0]):
                act = self.pair_stack_block(act, TEMPLATE_ITER, b, pair_mask)
            total = total + self.layer_norm(act, SINGLE + "output_layer_norm")
        return self.linear(np.maximum(total / len(pair_inputs), 0.0), TEMPLATE + "output_linear")

    def first_pass(self, target_feat, msa_feat, msa_mask, relative_feat, template_pair_inputs,
                   template_single_feat, template_row_mask, extra_msa_feat, extra_msa_mask,
                   seq_mask):
        """Recycling pass 0 (zero prev_*) -> {single, pair, msa}."""
        L = target_feat.shape[0]
        pair_mask = seq_mask[:, None] * seq_mask[None, :]
        m = (self.linear(target_feat, EVO + "preprocess_1d")[None]
             + self.linear(msa_feat, EVO + "preprocess_msa"))
        z = (self.linear(target_feat, EVO + "left_single")[:, None]
             + self.linear(target_feat, EVO + "right_single")[None])
        n_bins = self.p(EVO + "prev_pos_linear//weights").shape[0]
        z = z + self.linear(np.zeros((L, L, n_bins)), EVO + "prev_pos_linear")
        m[0] = m[0] + self.layer_norm(np.zeros((L, m.shape[-1])), EVO + "prev_msa_first_row_norm")
        z = z + self.layer_norm(np.zeros_like(z), EVO + "prev_pair_norm")
        z = z + self.linear(relative_feat, EVO + "~_relative_encoding/position_activations")
        z = z + self.template_pair(z, template_pair_inputs, pair_mask)
        e = self.linear(extra_msa_feat, EVO + "extra_msa_activations")
        n_extra = self.p(EVO + "extra_msa_stack/outer_product_mean//output_b").shape[0]
        for b in range(n_extra):
            e, z = self.evoformer_block(e, z, extra_msa_mask, pair_mask,
                                        EVO + "extra_msa_stack/", b, True)
        rows = self.linear(np.maximum(self.linear(template_single_feat,
                                                  EVO + "template_single_embedding"), 0.0),
                           EVO + "template_projection")
        num_msa = m.shape[0]
        m = np.concatenate([m, rows], 0)
        mask = np.concatenate([msa_mask, template_row_mask], 0)
        n_blocks = self.p(EVO + "evoformer_iteration/outer_product_mean//output_b").shape[0]
        for b in range(n_blocks):
            m, z = self.evoformer_block(m, z, mask, pair_mask, EVO + "evoformer_iteration/", b,
                                        False)
        return {"single": self.linear(m[0], EVO + "single_activations"), "pair": z,
                "msa": m[:num_msa]}
