"""What keeps a run going at scale: the run's guards (`guards/`: pre-emption signals, the launcher's death, helper
processes, bus errors, the progress watchdog, the other hosts' check, the straggler's measurement, and the rules on
what they find), in-job restarts, the goodput model at scale and the save interval chosen from the goodput account. The
--save lock is the checkpoint's (`checkpoint/lock.py`)."""
