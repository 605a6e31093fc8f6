"""Device check of the compact batch path (issue 27): compact host examples built on the CPU,
copied from pinned memory with non_blocking copies and expanded on the device; checks the
result equals `featurize` bit for bit and reports bytes and times.

    python benchmarks/loader_gpu_check.py [--device cuda] [--rows 5000 --length 384]

On a GPU machine this is the one script to run; on CPU (the test suite runs it small) it
checks the same equality.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loader import synthetic_family  # noqa: E402  (benchmarks/loader.py)

from protdp.data.features import collate, featurize  # noqa: E402
from protdp.data.pipeline.compact import compact_example, nbytes  # noqa: E402
from protdp.data.pipeline.expand import expand_batch  # noqa: E402
from protdp.model.inputs import extra_msa_feat, msa_feat  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--length", type=int, default=384)
    ap.add_argument("--crop", type=int, default=256)
    ap.add_argument("--clusters", type=int, default=512)
    ap.add_argument("--extra", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    kw = dict(crop_size=args.crop, max_msa_rows=args.clusters, max_extra_msa_rows=args.extra,
              msa_samples=args.samples)
    fams = [synthetic_family(args.rows, args.length, s) for s in range(args.batch)]
    compacts = [compact_example(f, seed=s, **kw) for s, f in enumerate(fams)]
    reference = collate([featurize(f, seed=s, **kw) for s, f in enumerate(fams)])
    expand_batch(compacts, device)                          # warm-up (CUDA context, kernels)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    batch = expand_batch(compacts, device)
    feats = msa_feat(batch, torch.float32), extra_msa_feat(
        batch["extra_msa"], batch["extra_has_deletion"], batch["extra_deletion_value"], torch.float32)
    if device.type == "cuda":
        torch.cuda.synchronize()
    expand_s = time.perf_counter() - t0
    equal = all(torch.equal(reference[k].nan_to_num(), batch[k].cpu().nan_to_num())
                for k in reference if isinstance(reference[k], torch.Tensor))
    # the feed's GPU path: the ready thread pins the compact arrays, then they are expanded
    from protdp.data.pipeline.ready import pin_arrays
    pinned = pin_arrays(compacts) if device.type == "cuda" else compacts
    via_pinned = expand_batch(pinned, device)
    equal_pinned = all(torch.equal(reference[k].nan_to_num(), via_pinned[k].cpu().nan_to_num())
                       for k in reference if isinstance(reference[k], torch.Tensor))
    equal = equal and equal_pinned
    result = {"device": str(device), "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              **kw, "msa_rows": args.rows, "length": args.length, "batch": args.batch,
              "equal_to_featurize": bool(equal), "equal_via_pinned": bool(equal_pinned),
              "bytes_per_example_featurized": nbytes(reference) / args.batch,
              "bytes_per_example_compact": sum(nbytes(c) for c in compacts) / args.batch,
              "expand_and_msa_feat_s": expand_s,
              "msa_feat_shape": list(feats[0].shape), "extra_msa_feat_shape": list(feats[1].shape)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
