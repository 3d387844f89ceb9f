"""``python3 -m proxyep.bench ep|ll|moe``: DeepEP's tests as benchmarks through the Python API
(``deep_ep``), against the C++ bench of the same shape in the same run (the binding's cost) and
against what a PyTorch user writes without an EP library (``all_to_all_single`` over gloo).
``moe``: TinyMoELM (proxyep.moe) training steps and decode with the exchange through ProxyEP
against the same model over ``all_to_all_single`` (moe.py)."""
