"""What installing the package needs before its dependencies exist (the Dockerfile runs it on NVIDIA's image, before
megatron-core is installed): the supported releases, declared once (`releases`), and the megatron-core release a
container's Transformer Engine runs (`te_support`). Nothing here imports torch or megatron-core."""
