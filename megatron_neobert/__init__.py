"""megatron_neobert: pre-train NeoBERT encoders with megatron-core, and take them to use.

Importing the package changes nothing in the process: the entry points (`megatron_neobert.pretrain`, the commands in
`megatron_neobert.cli`) set up logging, import megatron-core (`kernels.import_megatron_core`) and switch on CPU
execution where there is no GPU.
"""

__version__ = "0.1.0"
