"""Tensor-parallel styles for MX layers, drop-in for PyTorch's in ``parallelize_module``:

==========================  ===============================  ================================
style                       PyTorch's                        adds
==========================  ===============================  ================================
``MXColwiseParallel``       ``ColwiseParallel``              whole MX blocks per rank
                                                             (checked at apply); a Shard(d)
                                                             input gathered as MX
``MXRowwiseParallel``       ``RowwiseParallel``              whole MX blocks per rank
``MXSequenceParallel``      ``SequenceParallel``             whole blocks of tokens per
                                                             rank (checked each forward)
``PrepareMXModuleInput``    ``PrepareModuleInput``           Shard(d) -> Replicate gathered
                                                             as MX
==========================  ===============================  ================================

The MX gathers are :func:`mx_dtensor.mx_all_gather` (:mod:`mx_dtensor.gather`).
"""

from mx_dtensor.styles.linear import MXColwiseParallel, MXRowwiseParallel
from mx_dtensor.styles.prepare_input import PrepareMXModuleInput
from mx_dtensor.styles.sequence import MXSequenceParallel

__all__ = ["MXColwiseParallel", "MXRowwiseParallel", "MXSequenceParallel", "PrepareMXModuleInput"]
