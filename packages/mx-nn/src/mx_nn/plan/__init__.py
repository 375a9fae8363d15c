"""The tensor-parallel plan and the steps that apply it.

- :mod:`~mx_nn.plan.llama`: the plan as literal dicts in torchtitan 0.3 names;
- :mod:`~mx_nn.plan.families`: each family's names for them (Hugging Face Llama,
  Gemma2/3, OLMo2; torchtitan Llama3 fused or not, and classic), found by structure;
- :mod:`~mx_nn.plan.resolve`: the MX or plain style per module;
- :mod:`~mx_nn.plan.titan`: torchtitan's vocabulary-parallel embedding;
- :mod:`~mx_nn.plan.torchtitan`: mxstack as a torchtitan 0.3 model converter (imports
  torchtitan; imported only by name);
- :mod:`~mx_nn.plan.checks`: what ``parallelize`` checks before it changes anything;
- :mod:`~mx_nn.plan.apply`: ``apply_tp``, ``apply_compile``, ``apply_fsdp``.
"""
