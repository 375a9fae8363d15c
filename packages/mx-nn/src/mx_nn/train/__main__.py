"""``python -m mx_nn.train`` (and ``torchrun -m mx_nn.train``) runs ``mx-train``."""

import sys

from mx_nn.train.cli import main

sys.exit(main())
