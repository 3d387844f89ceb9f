from .buffers.legacy import Buffer  # noqa: F401  (the V1 module path DeepEP 1.x code imports)
