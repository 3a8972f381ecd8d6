"""What keeps a run going at scale: the process guards (pre-emption signals, the launcher's death, the progress
watchdog and the other hosts' check), the straggler rule (a slow rank named, its host's part ended on request), in-job
restarts, the goodput model at scale and the save interval chosen from the goodput account. The --save lock is the
checkpoint's (`checkpoint/lock.py`)."""
