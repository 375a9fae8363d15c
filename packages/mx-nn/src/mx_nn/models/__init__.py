"""Models mx-nn ships: :class:`~mx_nn.models.llama.Llama`, the compact decoder that
``mx-train`` trains and the tests parallelize."""

from mx_nn.models.llama import Attention, FeedForward, Llama, LlamaConfig, TransformerBlock

__all__ = ["Attention", "FeedForward", "Llama", "LlamaConfig", "TransformerBlock"]
