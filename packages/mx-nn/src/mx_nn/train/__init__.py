"""``mx-train``: train a small Llama on bytes in an MX recipe beside bf16.

Modules, one concern each: :mod:`~mx_nn.train.args` (flags), :mod:`~mx_nn.train.data`
(corpus, held-out split, batches), :mod:`~mx_nn.train.loop` (one run),
:mod:`~mx_nn.train.checkpoint` (generations, crash-safe) and its
:mod:`~mx_nn.train.manifest` (checksums), :mod:`~mx_nn.train.stop` (signals),
:mod:`~mx_nn.train.guard` (non-finite values), :mod:`~mx_nn.train.budget` (memory
bound of ``--seq``), :mod:`~mx_nn.train.progress`,
:mod:`~mx_nn.train.report` (table, figures, JSON), :mod:`~mx_nn.train.sample`,
:mod:`~mx_nn.train.distributed` (mesh, ``mx_nn.parallelize``), :mod:`~mx_nn.train.cli`.
"""

from mx_nn.train.args import TrainArgs, parse_args
from mx_nn.train.cli import main, run

__all__ = ["TrainArgs", "main", "parse_args", "run"]
