"""The launcher watch (`training/resilience/guards/launcher.py`): a rank whose torchrun is killed ends as torchrun
does, with its line, not a poll interval later (its peers would step on past a checkpoint meanwhile); a rank that
ends its torchrun itself goes on to say why."""

import re
import subprocess
import sys

TORCHRUN_KILLED = """
import logging, multiprocessing, os, signal, sys, time

def rank():
    from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    os.environ["TORCHELASTIC_RUN_ID"] = "a-run"
    LauncherWatch(poll_s=3600)  # a poll would look an hour later: only the wait on torchrun's exit can end the rank
    print("watching", flush=True)
    time.sleep(600)
    print("slept", flush=True)

# torchrun, its rank its child: killed once the rank watches
multiprocessing.get_context("fork").Process(target=rank).start()
assert sys.stdin.readline() == "kill\\n"
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_kill_9_of_torchrun_ends_its_rank_at_once_with_the_watchs_line():
    torchrun = subprocess.Popen([sys.executable, "-c", TORCHRUN_KILLED], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert torchrun.stdout.readline() == "watching\n"
    # until the rank, which shares torchrun's output, is gone too; a rank left sleeping fails the test here
    output, _ = torchrun.communicate("kill\n", timeout=60)
    assert torchrun.returncode == -9
    assert f"rank ?: torchrun (pid {torchrun.pid}) is gone; exiting without saving" in output, output
    assert "slept" not in output, output


TORCHRUN_ENDED_BY_ITS_RANK = """
import logging, multiprocessing, os, sys, time

def rank():
    from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    os.environ["TORCHELASTIC_RUN_ID"] = "a-run"
    watch = LauncherWatch(poll_s=0.05)  # the watch looks all the time: it must not take the end for torchrun's death
    time.sleep(0.5)
    watch.end_torchrun()
    time.sleep(3)  # past the watch's wait for the kernel to hand the rank to another parent
    print("said why", flush=True)

# torchrun, its rank its child, which ends it
multiprocessing.get_context("fork").Process(target=rank).start()
time.sleep(600)
"""


def test_a_rank_that_ends_its_torchrun_goes_on_to_say_why():
    """A drained straggler's rank (`LauncherWatch.end_torchrun`): torchrun is SIGKILLed and the rank, no longer
    watching it, goes on to its line."""
    torchrun = subprocess.Popen([sys.executable, "-c", TORCHRUN_ENDED_BY_ITS_RANK], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    output, _ = torchrun.communicate(timeout=120)  # until the rank, which shares torchrun's output, is gone too
    assert torchrun.returncode == -9
    assert "said why" in output and "is gone" not in output, output


TORCHRUN_GONE_BEFORE_THE_WATCH = """
import logging, os, signal, sys, time

torchrun = os.getpid()
if os.fork() == 0:  # the rank, slow to start (a loaded host): its torchrun is killed before it watches
    while os.getppid() == torchrun:
        time.sleep(0.01)
    from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    os.environ["TORCHELASTIC_RUN_ID"] = "a-run"
    LauncherWatch(poll_s=3600)
    time.sleep(600)
    print("slept", flush=True)
else:  # torchrun
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rank_whose_torchrun_died_before_it_watched_ends_with_the_watchs_line():
    """Adopted by what adopts orphans (this machine's init, here), which runs no Python: the watch must not take
    that for torchrun and watch it, the rank then waiting on the dead torchrun's store until its timeout."""
    torchrun = subprocess.Popen([sys.executable, "-c", TORCHRUN_GONE_BEFORE_THE_WATCH], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    output, _ = torchrun.communicate(timeout=60)  # until the rank, which shares torchrun's output, is gone too
    assert torchrun.returncode == -9
    assert re.search(r"rank \?: torchrun was gone before this rank looked \(its parent is now pid \d+, which does "
                     r"not run Python\); exiting without saving", output), output
    assert "slept" not in output, output
