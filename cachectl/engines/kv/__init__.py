"""The KV cache of one model: what it holds and costs per token, per context and per batch, read from a config
(arithmetic) or measured in a live transformers run on a random-weight or local model.

- :mod:`.config`: :func:`inspect_config`, config and GGUF reading, the catalog, KV shapes, GPU budgets
- :mod:`.live`: :func:`run_live`, :func:`run_turns`, :func:`run_shared_prefix`, :func:`run_quantized`
  (transformers' own cache classes; torch is imported on first use)
"""

from .config import (
    KvReport,
    KvShape,
    LayerGroup,
    inspect_config,
    kv_shape,
    layer_groups,
    read_gguf_config,
    resolve_model,
)
from .live import (
    LiveRun,
    QuantizedRun,
    SharedPrefixRun,
    TurnsRun,
    inspect_model,
    run_live,
    run_quantized,
    run_shared_prefix,
    run_turns,
)

__all__ = ["KvReport", "KvShape", "LayerGroup", "LiveRun", "QuantizedRun", "SharedPrefixRun", "TurnsRun",
           "inspect_config", "inspect_model", "kv_shape", "layer_groups", "read_gguf_config", "resolve_model",
           "run_live", "run_quantized", "run_shared_prefix", "run_turns"]
