"""Re-record `multimer_template_unit_diagonal.npz` from DeepMind's own AlphaFold-Multimer run.

AlphaFold v2.3.2's template backbone unit vectors are exactly zero for i = j in exact arithmetic,
but its fused float32 XLA kernels leave a rounding residue there that `normalized` scales up to
a vector of norm up to 1 (see `_alphafold_unit_diagonal` in tests/test_multimer_model.py). A
port cannot compute that noise, so the test replays it. This script reruns the fixture with
DeepMind's code and reads the inputs of `template_pair_embedding_{4,5,6}` through
`jax.debug.callback`; it only observes values, it does not change the computation.

Needs the fixture's environment (`../shared/af2_reference/multimer/README.md`: a venv with
jax/jaxlib, dm-haiku, pandas, numpy as in its `pip_freeze.txt`, and DeepMind's source at
v2.3.2 on PYTHONPATH); not part of the test suite:

    PYTHONPATH=<alphafold v2.3.2> <venv>/bin/python tests/data/record_multimer_template_diagonal.py \
        ../shared/af2_reference/multimer tests/data/multimer_template_unit_diagonal.npz

The run must reproduce the fixture's atoms bit for bit (checked below), or nothing is written.
"""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                      "intra_op_parallelism_threads=1 --xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true")   # the fixture's flags

import haiku as hk  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from alphafold.model import common_modules, config, data, modules_multimer  # noqa: E402

CASES = ("4hhb_hbA1-36_hbB1-40", "2p90_A02_x2")
UNIT_VECTOR_LAYERS = ("4", "5", "6")   # template_pair_embedding_{4,5,6}: x, y, z of the unit vector


def main(fixture: str, out_path: str) -> int:
    seen: dict[str, list[np.ndarray]] = {}
    linear_call = common_modules.Linear.__call__

    def observed_linear(self, x):
        name = self.module_name
        if "template_pair_embedding_" in name and name.split("_")[-1] in UNIT_VECTOR_LAYERS:
            jax.debug.callback(lambda v, n=name.split("_")[-1]: seen.setdefault(n, []).append(
                np.asarray(v)), x, ordered=True)
        return linear_call(self, x)

    common_modules.Linear.__call__ = observed_linear
    meta = json.load(open(os.path.join(fixture, "config_model_1_multimer_v3_small.json")))
    cfg = config.model_config(meta["base_model"])
    cfg.update_from_flattened_dict(meta["overrides"])
    params = data.get_model_haiku_params("model_1_multimer_v3_small", fixture)
    forward = hk.transform(lambda b: modules_multimer.AlphaFold(cfg.model)(
        b, is_training=False, return_representations=True))
    apply = jax.jit(forward.apply)
    diagonals = {}
    for case in CASES:
        seen.clear()
        feat = dict(np.load(os.path.join(fixture, f"features_{case}.npz")))
        result = apply(params, jax.random.PRNGKey(0), feat)
        jax.effects_barrier()
        ref = np.load(os.path.join(fixture, f"outputs_{case}.npz"))
        atoms = np.asarray(result["structure_module"]["final_atom_positions"])
        if not np.array_equal(atoms, ref["structure_module/final_atom_positions"]):
            print(f"{case}: this run does not reproduce the fixture bit for bit; nothing written")
            return 1
        n_templates = feat["template_aatype"].shape[0]
        # per call [T, L, L]; one call per template per recycling pass, in order
        unit = np.stack([np.stack(seen[c]) for c in UNIT_VECTOR_LAYERS], -1)   # [2T, T?, L, L, 3]
        unit = unit.reshape(-1, *unit.shape[-3:])                              # [2T, L, L, 3]
        first, second = unit[:n_templates], unit[n_templates:]
        assert np.array_equal(first, second), "the diagonal differs between recycling passes"
        diagonals[case] = np.einsum("tiic->tic", first).astype(np.float32)   # [T, L, 3]
        print(case, "templates", n_templates, "max norm",
              float(np.linalg.norm(diagonals[case], axis=-1).max()))
    np.savez_compressed(out_path, **diagonals)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
