"""The run's guards: how a rank and the processes around it end together, and never mid-checkpoint. One `Guards`
object (`guards.py`), which the training loop creates and closes, holds them all; each file is one part:

- `signals.py`, pre-emption. The scheduler sends `--exit-signal` (SIGTERM by default, as Megatron-LM), or the
  `--exit-duration-in-mins` wall-clock limit runs out. `ExitSignalHandler` only sets a flag; once per step
  `stop_requested` agrees on it with one all-reduce, so that every rank saves and stops at the same step even when the
  scheduler signalled one process (as Megatron-LM's DistributedSignalHandler does) or one rank's clock ran out first.
  The signal reaches whole process groups (torchrun forwards it to each rank's group, SLURM signals every process of a
  step), so the rank's helpers get it too: DataLoader workers ignore it and die with their rank (`data_worker_init`),
  and so does megatron-core's write-results server (`megatron_core_compat.keep_write_results_with_the_rank`).
- `children.py`, a rank that dies. Its helpers must not outlive it: `ChildrenTie` has every child the rank's main
  thread forks (checkpoint writers, DataLoader workers) killed with it, kill -9 included; a checkpoint writer whose
  rank died would otherwise wait on it forever (in `count_queue.get()`). `exit_now` ends a failed rank and its helpers
  at once, so that torchrun learns of the failure; `kill_stopped_local_ranks` ends a frozen (SIGSTOPped) peer, which
  would not act on torchrun's SIGTERM.
- `launcher.py`, a launcher that dies. Under torchrun, `LauncherWatch` ends a rank whose torchrun is gone (`kill -9`
  of torchrun, or of its node's agent) instead of training on unwatched, and ends torchrun for a rule that says so;
  `say_error` writes the rank's error line, on stderr and where torchrun's failure summary shows it.
- `bus_errors.py`, a data file that changes under the job. Reading a memory-mapped dataset file that was truncated
  raises a bus error inside the read; `BusErrors` turns it into one line naming the file, in the rank and its
  DataLoader workers, instead of a bare "Bus error" (or torch's guess, a lack of shared memory).
- `watchdog.py`, a peer that hangs. The others wait in their next collective without a word until
  --distributed-timeout-minutes; `ProgressWatchdog` says in the log, at half that time, which iteration and phase the
  rank waits in, and after --host-check-after-s without progress asks the other hosts to answer (`hosts.py`, the
  protocol) and applies the rules on what it found.
- `straggler.py`, a rank that stays slow. `StragglerDetector` (the loop holds it: it times the model's gradient
  reduction) measures each rank's compute time and exchanges it through the store every log interval, bounded in
  time, for the straggler rule on rank 0.
- `rules.py`, what the guards decide from what they found: a host silent past the bound (cut off from the network,
  powered off or frozen) ends the attempt with one line naming it, and on the host cut off from the rendezvous, its
  torchrun with it (`lost_host`; `thawed`, this host stopped past that bound); a rank that stays slow is named, and
  on request its host's part of the job ends (`StragglerRule`).
"""
