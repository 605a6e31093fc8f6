"""Pretraining entry point, like Megatron's pretrain_gpt.py: launch it with torchrun or mpirun.

    torchrun --nproc_per_node 2 pipelines/pretrain.py --data data.h5 \
        --model-config configs/model/small.yaml --micro-batch-size 1 --global-batch-size 8 \
        --overlap-grad-reduce --use-distributed-optimizer --train-iters 200 --save ckpt/ --save-interval 50

Same flags as `protdp train` (see `protdp train --help`).
"""

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if __name__ == "__main__":
    runpy.run_module("protdp.train", run_name="__main__", alter_sys=True)
