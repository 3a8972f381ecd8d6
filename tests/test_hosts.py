"""How a rank that waits tells a lost host from a slow one: the answers of `parallel.hosts`, and the progress
watchdog's check of the other hosts (the two-host rehearsal with network namespaces is tests/test_partition.py)."""

import re
import socket
import subprocess
import threading
import time

import pytest
import torch

from megatron_neobert.parallel.hosts import Host, HostAnswers, answers
from megatron_neobert.parallel.launch import DistributedState
from megatron_neobert.training.resilience import process_guards
from megatron_neobert.training.resilience.process_guards import ProgressWatchdog


@pytest.fixture
def one_rank_group(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    found = DistributedState()
    if not found.process_group:  # else the worker's one-rank group of an earlier test (single_rank), kept
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    assert torch.distributed.get_world_size() == 1
    yield
    found.release()


def test_a_rank_answers_a_frozen_process_does_not_and_a_gone_one_is_refused_by_its_host(one_rank_group):
    hosts = HostAnswers()
    try:
        assert hosts.others == [] and hosts.silent() == []  # one host: nobody to ask
        assert answers("127.0.0.1", hosts.server.getsockname()[1], echo=True)
        # A stopped (or cut off) process: the kernel may accept the connection, but no byte comes back.
        with socket.create_server(("127.0.0.1", 0)) as frozen:
            assert not answers("127.0.0.1", frozen.getsockname()[1], echo=True, timeout=0.5)
            assert answers("127.0.0.1", frozen.getsockname()[1], echo=False)  # a store only has to accept
            port = frozen.getsockname()[1]
        assert answers("127.0.0.1", port, echo=True)  # refused: the host is up, its process gone
    finally:
        hosts.close()
    time.sleep(0.1)
    assert not any(t.name == "host-answers" for t in threading.enumerate())


class FakeHosts:
    def __init__(self, silent):
        self.rendezvous = Host("host-a", "10.213.0.1", 29500, 0)
        self._silent, self.asked = silent, 0

    def silent(self):
        self.asked += 1
        return self._silent


@pytest.fixture
def ended(monkeypatch):
    """The watchdog's exit, recorded instead of taken."""
    calls = threading.Event()
    monkeypatch.setattr(process_guards, "exit_now", lambda code: calls.set())
    monkeypatch.setenv("RANK", "1")
    return calls


def test_a_slow_peer_on_hosts_that_answer_is_waited_for(ended):
    hosts = FakeHosts([])
    with ProgressWatchdog(10, 0.2, hosts) as watchdog:
        watchdog.at(7, "training step")
        time.sleep(1.0)
    assert hosts.asked >= 2 and not ended.is_set()  # asked again while it waits, never ended


def test_a_host_that_stops_answering_ends_the_attempt_naming_it(ended, capsys):
    with ProgressWatchdog(10, 0.2, FakeHosts([Host("host-b", "10.213.0.2", 4321, 1)])) as watchdog:
        watchdog.at(7, "training step")
        assert ended.wait(5)
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"error: rank 1: host host-b \(10\.213\.0\.2\) stopped answering at iteration 7 \(training "
                        r"step; no answer within 5 s after \d+ s without progress\); ending this attempt \(torchrun "
                        r"restarts it, or goes on without the host under --nnodes MIN:MAX\)", line), line


def test_a_rank_cut_off_from_the_rendezvous_host_ends_its_torchrun(ended, capsys, monkeypatch):
    launcher = subprocess.Popen(["sleep", "60"])
    monkeypatch.setitem(process_guards._launcher_watch, "launcher", launcher.pid)
    hosts = FakeHosts(None)
    hosts._silent = [hosts.rendezvous]
    try:
        with ProgressWatchdog(10, 0.2, hosts) as watchdog:
            watchdog.at(3, "training step")
            assert ended.wait(5)
        assert launcher.wait(5) == -9
    finally:
        launcher.kill()
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: rank 1: the rendezvous host host-a (10.213.0.1) is unreachable at iteration 3 "
                           "(training step; no answer within 5 s after ") and line.endswith(
        f"this host is cut off from the job; ending this attempt and torchrun (pid {launcher.pid}), which cannot "
        f"restart it without that host"), line
