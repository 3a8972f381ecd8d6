"""A process's start, from /proc: the save lock tells a live owner from a reused pid by it, and the goodput account
counts a run's start-up from it (the imports before any code of ours ran included) and from its launcher's. Free of
torch."""

import os
import time
from typing import Optional


def process_start_ticks(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2:].split()[19]  # fields after "pid (comm)", the 22nd overall


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """When process `pid` (this one by default) started (epoch seconds): its age from /proc, so that the imports
    before any code of ours ran are counted; None where /proc has no answer."""
    try:
        started_ticks = int(process_start_ticks(os.getpid() if pid is None else pid))
        with open("/proc/uptime") as uptime:
            age = float(uptime.read().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, TypeError, ValueError):
        return None
