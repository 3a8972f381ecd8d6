"""How a rank that waits tells a lost host from a slow one: the answers of the guards' `hosts.py`, the progress
watchdog's check of the other hosts with the lost-host rule, and a rank thawed after a stop (the two-host rehearsal
with network namespaces is tests/test_partition.py)."""

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from megatron_neobert.parallel.launch import DistributedState
from megatron_neobert.training.resilience.guards import watchdog as watchdog_module
from megatron_neobert.training.resilience.guards.hosts import (STORE_PING, ANSWERED, FROZEN, Answers, Host, HostAnswers,
                                                               answers, asked_by, reply)
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
from megatron_neobert.training.resilience.guards.rules import silent_bound
from megatron_neobert.training.resilience.guards.watchdog import ProgressWatchdog


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
        assert hosts.others == [] and not hosts.ask().someone_silent  # one host: nobody to ask
        assert answers("127.0.0.1", hosts.server.getsockname()[1])
        # A stopped (or cut off) process: the kernel may accept the connection, but no byte comes back.
        with socket.create_server(("127.0.0.1", 0)) as frozen:
            assert reply("127.0.0.1", frozen.getsockname()[1], b"?", timeout=0.5) == FROZEN
            assert not answers("127.0.0.1", frozen.getsockname()[1], timeout=0.5)
            port = frozen.getsockname()[1]
        assert answers("127.0.0.1", port)  # refused: the host is up, its process gone
    finally:
        hosts.close()
    time.sleep(0.1)
    assert not any(t.name == "host-answers" for t in threading.enumerate())


def ranks_on(*ranks_per_host: int) -> list:
    """One Host per rank, the ranks of each host consecutive, as torchrun numbers them."""
    everyone = []
    for index, count in enumerate(ranks_per_host):
        address = f"10.0.{index // 250}.{index % 250 + 1}"
        everyone += [Host(f"host-{index}", address, 4000 + local, len(everyone) + local) for local in range(count)]
    return everyone


def test_each_rank_asks_its_counterparts_on_the_neighbouring_hosts_and_each_rank_is_asked_twice():
    everyone = ranks_on(*[8] * 100)
    asked = {host.rank: asked_by(everyone, host.rank) for host in everyone}
    assert [(h.name, h.rank) for h in asked[8 * 50 + 3]] == [("host-51", 8 * 51 + 3), ("host-49", 8 * 49 + 3)]
    assert [h.rank for h in asked[0]] == [8 + 0, 8 * 99]  # the ring closes
    times_asked = collections.Counter(h.rank for hosts in asked.values() for h in hosts)
    # 3 connections per rank a round (the store's included) however many hosts: 2,400 at 800 ranks.
    assert all(len(hosts) == 2 for hosts in asked.values()) and set(times_asked.values()) == {2}
    assert not any(h.address == everyone[rank].address for rank, hosts in asked.items() for h in hosts)


def test_uneven_hosts_and_small_jobs():
    everyone = ranks_on(3, 1, 2)
    assert [h.rank for h in asked_by(everyone, 2)] == [3, 4]  # local index 2: host-1's only rank, host-2's 2 % 2 = 0
    assert [h.rank for h in asked_by(everyone, 3)] == [4, 0]
    assert [h.rank for h in asked_by(ranks_on(2, 2), 1)] == [3]  # two hosts: one neighbour, both ways
    assert asked_by(ranks_on(4), 2) == []


@pytest.mark.parametrize("silent, store_silent, asked, cut_off", [
    (("b", "c"), True, 2, True),
    (("b",), True, 2, False),  # c answered: the store's host is lost, not this one
    (("b", "c"), False, 2, False),  # the store answered: b and c are lost
    ((), True, 0, True),  # a host that asks only the store
])
def test_a_host_is_cut_off_when_neither_the_store_nor_any_asked_rank_answers(silent, store_silent, asked, cut_off):
    found = Answers([Host(name, "10.0.0.2", 1, 1) for name in silent], store_silent, asked)
    assert found.someone_silent and found.cut_off == cut_off


def test_no_one_is_silent_when_every_asked_host_and_the_store_answer():
    assert not Answers([], store_silent=False, asked=2).someone_silent


STORE = """
import time
import torch.distributed
store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv={libuv})
print(store.port, flush=True)
time.sleep(600)
"""


def stop(pid: int) -> None:
    """SIGSTOP, returning once every thread of the process is stopped: the signal is sent at once, but a thread then
    running (the classic store's server thread, answering) stops only as it next enters the kernel."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while any(open(f"/proc/{pid}/task/{task}/stat").read().rsplit(")", 1)[1].split()[0] not in "Tt"
              for task in os.listdir(f"/proc/{pid}/task")):
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.01)


@pytest.mark.parametrize("libuv", [True, False])
def test_a_running_store_answers_the_ping_a_stopped_one_is_reached_but_frozen(libuv):
    """torchrun's store (libuv's server) and a rank 0's (the classic one) answer the ping; stopped, as on a frozen host,
    the kernel still accepts the connection and nothing answers: FROZEN, where a plain connection would have passed."""
    store = subprocess.Popen([sys.executable, "-c", STORE.format(libuv=libuv)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(store.stdout.readline())
        assert reply("127.0.0.1", port, STORE_PING, timeout=2) == ANSWERED
        stop(store.pid)
        assert reply("127.0.0.1", port, STORE_PING, timeout=1) == FROZEN
        store.send_signal(signal.SIGCONT)
        assert reply("127.0.0.1", port, STORE_PING, timeout=2) == ANSWERED
    finally:
        store.kill()
        store.wait()
    assert reply("127.0.0.1", port, STORE_PING, timeout=1) == ANSWERED  # refused: the host is up, the store gone


class FakeHosts:
    def __init__(self, silent=(), store_silent=False, asked=1, reached=False):
        self.rendezvous = Host("host-a", "10.213.0.1", 29500, 0)
        self.found, self.asked = Answers(list(silent), store_silent, asked, reached), 0

    def ask(self):
        self.asked += 1
        return self.found


@pytest.fixture
def ended(monkeypatch):
    """The watchdog's exit, recorded instead of taken."""
    calls = threading.Event()
    monkeypatch.setattr(watchdog_module, "exit_now", lambda code: calls.set())
    monkeypatch.setenv("RANK", "1")
    return calls


def test_a_slow_peer_on_hosts_that_answer_is_waited_for(ended):
    hosts = FakeHosts()
    with ProgressWatchdog(10, 0.2, hosts) as watchdog:
        watchdog.at(7, "training step")
        time.sleep(1.0)
    assert hosts.asked >= 2 and not ended.is_set()  # asked again while it waits, never ended


@pytest.mark.parametrize("launcher, then", [
    (4242, "torchrun restarts it, or goes on without the host under --nnodes MIN:MAX"),
    (None, "srun --kill-on-bad-exit ends the job step; its requeue resumes from the latest checkpoint"),
])
def test_a_host_that_stops_answering_ends_the_attempt_naming_it(launcher, then, ended, capsys):
    with ProgressWatchdog(10, 0.2, FakeHosts([Host("host-b", "10.213.0.2", 4321, 1)]),
                          LauncherWatch(thread=False, pid=launcher)) as watchdog:
        watchdog.at(7, "training step")
        assert ended.wait(5)
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"error: rank 1: host host-b \(10\.213\.0\.2\) stopped answering at iteration 7 \(training "
                        r"step; no answer within 5 s after \d+ s without progress\); ending this attempt "
                        rf"\({re.escape(then)}\)", line), line


@pytest.mark.parametrize("hosts, begins, ends, torchrun_killed", [
    (FakeHosts([Host("host-a", "10.213.0.1", 4321, 0)], store_silent=True),  # neither its neighbour nor the store
     "the rendezvous host host-a (10.213.0.1) is unreachable at iteration 3 (training step; ",
     "this host is cut off from the job; ending this attempt and torchrun (pid {pid}), which cannot restart it without "
     "that host", True),
    (FakeHosts(store_silent=True, asked=2),  # its neighbours answered, the store did not
     "the rendezvous host host-a (10.213.0.1) stopped answering at iteration 3 (training step; ",
     "the job cannot go on without its store: ending this attempt and torchrun (pid {pid}), which cannot restart it "
     "without that host", True),
    # The store's host frozen: neither its rank nor its store answered, but its kernel accepted the connections.
    (FakeHosts([Host("host-a", "10.213.0.1", 4321, 0)], store_silent=True, reached=True),
     "the rendezvous host host-a (10.213.0.1) stopped answering at iteration 3 (training step; ",
     "the job cannot go on without its store: ending this attempt and torchrun (pid {pid}), which cannot restart it "
     "without that host", True),
    (FakeHosts([Host("host-b", "10.213.0.2", 4321, 1)], asked=2),  # torchrun restarts the workers
     "host host-b (10.213.0.2) stopped answering at iteration 3 (training step; ",
     "ending this attempt (torchrun restarts it, or goes on without the host under --nnodes MIN:MAX)", False),
])
def test_torchrun_is_ended_with_the_attempt_when_the_rendezvous_host_is_out_of_reach(hosts, begins, ends,
                                                                                     torchrun_killed, ended, capsys):
    launcher = subprocess.Popen(["sleep", "60"])
    try:
        with ProgressWatchdog(10, 0.2, hosts, LauncherWatch(thread=False, pid=launcher.pid)) as watchdog:
            watchdog.at(3, "training step")
            assert ended.wait(5)
        if torchrun_killed:
            assert launcher.wait(5) == -signal.SIGKILL
        else:
            time.sleep(0.2)
            assert launcher.poll() is None
    finally:
        launcher.kill()
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: rank 1: " + begins) and line.endswith(ends.format(pid=launcher.pid)), line


THAWED_RANK = """
import time
from megatron_neobert.training.resilience.guards.hosts import Answers, Host
from megatron_neobert.training.resilience.guards.watchdog import ProgressWatchdog

class Answering:
    rendezvous = Host("host-a", "10.213.0.1", 29500, 0)

    def ask(self):
        return Answers([], False, 1)

with ProgressWatchdog(10, {check_s}, Answering()) as watchdog:
    print("watching", flush=True)
    while True:  # progress all along: only being stopped can end it
        watchdog.at(1, "training step")
        time.sleep(0.05)
"""


def test_a_process_stopped_past_the_bound_ends_once_thawed_and_a_shorter_stop_is_let_be():
    """SIGSTOP, as on a frozen host: stopped for less than the others wait before naming the host, the rank goes on;
    stopped longer, it ends with one line as soon as it runs again."""
    check_s = 0.4
    rank = subprocess.Popen([sys.executable, "-c", THAWED_RANK.format(check_s=check_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "RANK": "1"})
    try:
        assert rank.stdout.readline() == "watching\n", rank.stderr.read()
        bound = silent_bound(check_s)
        for stopped_s in (2.0, bound + 2):
            rank.send_signal(signal.SIGSTOP)
            time.sleep(stopped_s)
            rank.send_signal(signal.SIGCONT)
            thawed = time.monotonic()
            if stopped_s < bound:
                time.sleep(2.0)
                assert rank.poll() is None, rank.stderr.read()
        assert rank.wait(timeout=10) == 1
        ended_s = time.monotonic() - thawed
    finally:
        rank.kill()
    line = next((line for line in rank.stderr.read().splitlines() if line.startswith("error: ")), None)
    assert line and re.fullmatch(rf"error: rank 1: this host was stopped for \d+ s, longer than the other hosts wait "
                                 rf"before going on without it \({bound:g} s\): ending this attempt without writing "
                                 rf"anything \(start it again to rejoin the job\)", line), line
    assert ended_s < 2.0
