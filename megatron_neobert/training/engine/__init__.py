"""The training loop: the `Trainer` and its phases (`trainer`) inside the process guards (`loop.train`), the model's
and the data's set-up, the step and its loss, the optimizer step, evaluation. The top of training: it reads the
other rooms."""
