"""megatron_neobert: pre-train NeoBERT encoders with megatron-core, and take them to use."""

__version__ = "0.1.0"
