"""`--compile` (issue 29 D4): a compiled Evoformer block gives eager's outputs and gradients,
and keeps its parameter names. The suite traces with the "aot_eager" backend (Dynamo capture +
AOTAutograd functionalisation of the in-place ops, the parts that can change numerics or break
the graph); inductor's C++ code generation takes minutes on the shared CPU, so its numerics
(same check) and speed are measured by benchmarks/compile.py."""

import torch

from model_fixtures import one_thread  # noqa: F401

from protdp.config import read_yaml
from protdp.model.compile import compile_evoformer_blocks
from protdp.model.config import ModelConfig
from protdp.model.evoformer import EvoformerStack
from protdp.resources import resolve_config


def test_compiled_block_equals_eager_forward_and_backward():
    cfg = ModelConfig(**{**read_yaml(resolve_config("tiny", "model")), "msa_dropout": 0.0,
                         "pair_dropout": 0.0, "n_blocks": 1})
    torch.manual_seed(0)
    stack = EvoformerStack(cfg)
    for p in stack.parameters():
        torch.nn.init.normal_(p, std=0.1)
    names = [n for n, _ in stack.named_parameters()]
    m = torch.randn(1, 5, 13, cfg.c_m, requires_grad=True)
    z = torch.randn(1, 13, 13, cfg.c_z, requires_grad=True)
    msa_mask, pair_mask = torch.ones(1, 5, 13), torch.ones(1, 13, 13)
    msa_mask[:, 3:, 9:] = 0

    def run():
        stack.zero_grad()
        mo, zo, s = stack(m, z, msa_mask, pair_mask)
        loss = mo.square().mean() + zo.square().mean() + s.square().mean()
        grads = torch.autograd.grad(loss, [m, z] + list(stack.parameters()))
        return [mo, zo, s, *grads]

    ref = run()
    assert compile_evoformer_blocks(stack, backend="aot_eager", dynamic=False) == 1
    got = run()
    assert [n for n, _ in stack.named_parameters()] == names        # checkpoints unchanged
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
