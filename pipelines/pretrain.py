"""Pretraining entry point, like Megatron's pretrain_gpt.py: launch it with torchrun or mpirun.

    torchrun --nproc_per_node 2 pipelines/pretrain.py --data data.h5 \
        --model-config configs/model/small.yaml --micro-batch-size 1 --global-batch-size 8 \
        --overlap-grad-reduce --use-distributed-optimizer --train-iters 200 --save ckpt/ --save-interval 50

Same flags as `protdp train` (see `protdp train --help`).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protdp.errors import ProtdpError  # noqa: E402
from protdp.train.cli import main  # noqa: E402

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ProtdpError as exc:
        print(f"pretrain: error: {exc}", file=sys.stderr)
        sys.exit(2)
