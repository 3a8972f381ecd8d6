"""Checkpoints, in four modules that import each other one way only (layout <- integrity <- state; layout <- lock):

- `layout`: where checkpoints are: the marker, iteration folders, finding the one to load, pruning;
- `integrity`: the checksum manifest written at save and verified at load; a save that runs out of disk;
- `state`: what a folder holds (model, optimizer, scheduler, RNG, Megatron-LM args), saving and loading it,
  and `read_checkpoint`, the one way to a checkpoint's args for the trainer and the converters;
- `lock`: one live run writing to a --save folder, and only to its own checkpoints.
"""
