"""Serving export: a trained MX model as a Hugging Face model folder in compressed-tensors'
MX formats, holding the exact codes it trained with, and back.

- :func:`export` (also ``mx_nn.export_model``): a model in memory, one process or a live
  ``mx_nn.parallelize``-d model under a process group (rank 0 writes).
- :func:`export_checkpoint`: a ``torch.distributed.checkpoint`` of any TP/FSDP layout,
  read one tensor at a time; ``python -m mx_nn.export CHECKPOINT OUT`` does it for an
  ``mx-train`` checkpoint (and ``mx-train --export DIR`` at the end of a run).
- :func:`load_pretrained`: such a folder into an MX model, to train it further.

Modules, one concern each: :mod:`~mx_nn.export.schemes` (the two layouts and their
config), :mod:`~mx_nn.export.weights` (the training cast of a weight, and back),
:mod:`~mx_nn.export.llama_names` (mx-nn's Llama under Hugging Face names),
:mod:`~mx_nn.export.plan` (what a model becomes), :mod:`~mx_nn.export.safetensors_io`,
:mod:`~mx_nn.export.hf_dir` (the folder), :mod:`~mx_nn.export.stream` (the loop),
:mod:`~mx_nn.export.api`, :mod:`~mx_nn.export.from_dcp`, :mod:`~mx_nn.export.load`.

``mx_nn.export`` is this subpackage and the function is ``mx_nn.export.export`` (also
``mx_nn.export_model``): one name cannot be both a package and a function.
"""

from mx_nn.export.api import export
from mx_nn.export.from_dcp import export_checkpoint
from mx_nn.export.load import load_pretrained
from mx_nn.export.schemes import SCHEMES, Scheme

__all__ = ["SCHEMES", "Scheme", "export", "export_checkpoint", "load_pretrained"]
