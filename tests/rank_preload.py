"""What the ranks the tests start run: the trainer and the converter. conftest.py names them for the server that CPU
ranks are forked from to import once, whichever test of a worker starts ranks first."""

TRAINER_AND_CONVERTER = ("megatron_neobert.training.engine.trainer", "megatron_neobert.conversion.convert")
