"""megatron_neobert: pre-train NeoBERT encoders with megatron-core, and take them to use."""

import warnings

__version__ = "0.1.0"

# megatron-core warns at import time about each missing GPU extension; we log the kernel paths
# that actually run once, at start-up (megatron_neobert.kernels), instead.
for _message in (".*Transformer Engine and Apex are not installed.*", ".*Apex is not installed.*",
                 ".*full scope is deprecated.*"):
    warnings.filterwarnings("ignore", message=_message)

# Say in one line what is wrong with a half-installed Transformer Engine, before megatron-core's import
# fails on it.
from megatron_neobert.kernels import check_transformer_engine_before_megatron_core  # noqa: E402

check_transformer_engine_before_megatron_core()
