"""`python -m protdp.train ...`: the training worker that torchrun / mpirun / srun launch
(same flags as `protdp train` and `pipelines/pretrain.py`)."""

import sys

from protdp.errors import ProtdpError
from protdp.train.cli import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ProtdpError as exc:
        print(f"pretrain: error: {exc}", file=sys.stderr)
        sys.exit(2)
