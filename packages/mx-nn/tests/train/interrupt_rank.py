"""``mx-train`` under torchrun with SIGTERM raised on one rank only, inside one step.

Usage: ``torchrun ... interrupt_rank.py RANK CALL <mx-train flags>``: on rank ``RANK``
the ``CALL``-th training step (counted over all runs, from 1) gets SIGTERM while it
runs; every rank must stop after that same step, write the checkpoint and exit 130.
"""

import os
import signal
import sys

from mx_nn.train import loop
from mx_nn.train.cli import console


def _interrupt(rank: int, call: int) -> None:
    real, calls = loop._train_step, [0]

    def step(*args):
        calls[0] += 1
        if calls[0] == call and int(os.environ["RANK"]) == rank:
            signal.raise_signal(signal.SIGTERM)
        return real(*args)

    loop._train_step = step


if __name__ == "__main__":
    _interrupt(int(sys.argv[1]), int(sys.argv[2]))
    console(sys.argv[3:])
