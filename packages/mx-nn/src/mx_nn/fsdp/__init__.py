"""FSDP2 and MXLinear: weights gathered in MX.

- :mod:`~mx_nn.fsdp.weight`: the sharded and gathered weight subclasses FSDP2 calls;
- :mod:`~mx_nn.fsdp.gathered`: how MXLinear reads a weight FSDP2 gathered in MX;
- :mod:`~mx_nn.fsdp.enable`: :func:`~mx_nn.fsdp.enable.enable_fsdp_mx_all_gather`;
- :mod:`~mx_nn.fsdp.check`: what must hold before it applies.

(No re-exports here: :mod:`mx_nn.linear` imports :mod:`~mx_nn.fsdp.gathered`, and
:mod:`~mx_nn.fsdp.enable` imports :mod:`mx_nn.linear`.)
"""
