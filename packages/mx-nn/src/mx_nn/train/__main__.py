"""``python -m mx_nn.train`` (and ``torchrun -m mx_nn.train``) runs ``mx-train``."""

from mx_nn.train.cli import console

console()
