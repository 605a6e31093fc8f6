"""`python -m protdp.train ...`: the training worker that torchrun / mpirun / srun launch
(same flags as `protdp train` and `pipelines/pretrain.py`)."""

import sys

from protdp.errors import ProtdpError
from protdp.parallel.env import leave_process
from protdp.train.cli import main

if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except ProtdpError as exc:
        print(f"pretrain: error: {exc}", file=sys.stderr)
        code = 2
    leave_process(code)
