"""Batch prediction entry point: launch it plainly or with torchrun / mpirun / srun; the targets
are sharded across ranks (target i goes to rank i % world_size) and rank 0 writes summary.tsv.

    torchrun --nproc_per_node 2 pipelines/predict.py --checkpoint ckpt/ --fasta targets.fasta \
        --msa-dir msas/ --out predictions/

Same flags as `protdp predict` (see `protdp predict --help`).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protdp.errors import ProtdpError  # noqa: E402
from protdp.inference.cli import main  # noqa: E402
from protdp.parallel.env import leave_process  # noqa: E402

if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except ProtdpError as exc:
        print(f"predict: error: {exc}", file=sys.stderr)
        code = 2
    leave_process(code)
