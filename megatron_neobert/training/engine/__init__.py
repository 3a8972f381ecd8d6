"""The training loop: the `Trainer` and its phases (`trainer`) inside the process guards of the entry point
(`entry.train`), the model's and the data's set-up, the forward step and its loss (`forward_step`), the optimizer
step over a global batch (`train_step`), evaluation. The top of training: it reads the other rooms."""
