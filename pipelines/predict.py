"""Batch prediction entry point: launch it plainly or with torchrun / mpirun / srun; the ranks
claim targets from one leased work queue (`protdp.inference.work`; several plain launches on
the same inputs and --out share it too) and summary.tsv is written from it at the end.

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
