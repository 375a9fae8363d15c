"""MXLinear layers after an MX all-gather take its cast instead of casting again.

mx-dtensor's ``PrepareMXModuleInput`` and ``MXColwiseParallel`` gather a sequence shard
as its rowwise MX cast and hand the module the decoded values; q/k/v (gate/up) would
then cast those values rowwise along the same blocks, which gives the same values back
(mx-dtensor's ``test_recasting_decoded_values_reproduces_them``: every format and scale
mode). The hook :func:`enable_gather_handover` registers
(``mx_dtensor.register_gather_hook``; ``parallelize`` calls it when it installs an MX
gather) primes the open cast scope (:mod:`mx_nn.casts.scopes`; ``parallelize`` gives
every module whose input an MX gather prepares a scope) with the result of MXLinear's
forward input cast of the gathered tensor, so the linears called inside that module
find it there and none casts:

- fused path (``fake_quantize_rowwise``): the decoded tensor itself;
- MX path (``quantize_rowwise``): the gathered codes and scales. They decode to the same
  values as a recast, though not always in the same representation: with ceil-type
  scale modes a block whose decoded amax rounded down gets a scale one lower and codes
  twice as large from the recast. A GEMM multiplies the values; scaling one operand's
  codes by two and its scale by a half scales every product and partial sum by exact
  powers of two, so the output is the same.

The key is the one MXLinear's own call uses (the [M, K] view of the input, the cast,
its fmt, block size, scale mode and backend): a gather with another cast than the
linears' primes entries they never match, and they cast as before; so does a gather
with no scope open. Eager only, as the cache (under torch.compile the hooks are not
called).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

import mx_kernels
from mx_dtensor import GatheredCast, register_gather_hook
from mx_nn.casts.scopes import prime_cast

__all__ = ["enable_gather_handover", "prime_linear_inputs"]

_HANDLE: list = []  # the registered hook's handle, once registered


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def prime_linear_inputs(gathered: GatheredCast) -> None:
    """Prime MXLinear's forward input casts (both paths) of ``gathered.decoded``.

    MXLinear casts the local tensor of its (Replicate) DTensor input
    (:mod:`mx_nn.dtensor.local_shards`), so the keys and casts primed are local tensors too.

    Args:
        gathered: the gather's decoded input, codes, scales and cast settings.
    """
    x = _local(gathered.decoded)
    # Plain strings and an int, as MXLinear's own call passes them (mx_nn.casts.compute_path).
    kwargs = gathered.cast.as_kwargs()
    fmt = kwargs.pop("fmt")
    with torch.no_grad():  # views for the cache's keys, outside the autograd graph
        x2 = x.reshape(-1, x.shape[-1])  # MXLinear's [M, K] view of its input
        cast = tuple(_local(t).reshape(-1, t.shape[-1]) for t in (gathered.qdata, gathered.scale))
    # Looked up at each call, as MXLinear does: the cast function is part of the key.
    for fn, out in ((mx_kernels.fake_quantize_rowwise, x2), (mx_kernels.quantize_rowwise, cast)):
        prime_cast(fn.__name__, fn, x2, out, fmt, **kwargs)


def enable_gather_handover() -> None:
    """Register :func:`prime_linear_inputs` as an MX gather hook (once per process;
    idempotent), so the gathers hand their cast to the MXLinear layers in an open cast
    scope. Importing mx-nn registers nothing: the steps that install MX gathers call this."""
    if not _HANDLE:
        _HANDLE.append(register_gather_hook(prime_linear_inputs))
