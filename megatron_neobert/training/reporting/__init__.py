"""What a run reports: the console and TensorBoard/wandb log (`train_log`), the step's metrics, the goodput account
(where the job's time went), the profiler and the start-up lines. Below resilience and the engine, which report
through it."""
