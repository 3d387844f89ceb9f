"""Framework adapters over ``deep_ep`` (docs/ADAPTERS.md):

* :mod:`proxyep.adapters.megatron`: the functions of Megatron-LM's
  ``megatron/core/transformer/moe/fused_a2a.py`` (``fused_dispatch``, ``fused_combine``,
  ``set_deepep_num_sms``, ``get_buffer``, ``get_hidden_bytes``) with its signatures and returns,
  so that the flex token dispatcher runs on ProxyEP by changing one import;
* :mod:`proxyep.adapters.sglang`: an SGLang-shaped ``DeepEPDispatcher``
  (``dispatch_a/dispatch_b/combine_a/combine_b``; normal, low-latency and auto modes);
* :mod:`proxyep.adapters.vllm`: vLLM-shaped ``DeepEPHTPrepareAndFinalize`` (normal mode) and
  ``DeepEPLLPrepareAndFinalize`` (low-latency mode) with their Buffer constructors.

The submodules are imported on use (``import proxyep.adapters.megatron``), so importing one
does not build the others.
"""

__all__ = ["megatron", "sglang", "vllm"]
