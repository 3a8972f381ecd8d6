"""A run's configuration: the settings declared once (`settings`), the command line generated from them (`arguments`)
and resolved into the run's settings (`resolve`), the schedule and batch sizes, the starting checkpoint read before
the checks, the checks of the model's shape against the parallel layout (`run_checks`), and stage 2's plan: what a
run declares and resolves, not what runs (the scheduler and the data files' guard are the engine's). Imports nothing
else of training."""
