"""A host cut off from the network, rehearsed on this machine: two network namespaces stand for two hosts (host-a
10.213.0.1, host-b 10.213.0.2, each with its own host name), their links on a bridge in a third; one torchrun agent
per host, one gloo rank each, c10d rendezvous on host-a, the tiny model. A link is cut by taking host-b's port off the
bridge: its packets vanish, both hosts stay up, nothing is killed (tc netem and iptables are not available here).
A host is frozen by SIGSTOPping every process in its namespace (its kernel still accepts connections, nothing
answers), and thawed by SIGCONT: under --nnodes 1:2 host-b, under a fixed --nnodes 2 either host (the store's, or the
other). A slow host is throttled from a thread of the test that stops every process of host-b 75 ms of each 100 ms:
the straggler rule names it and, with --straggler-exit-intervals, drains it, the other host going on alone.

The rehearsal runs with short timeouts (--host-check-after-s 5, rendezvous timeouts in seconds) so that it fits CI;
docs/training.md states what the bounds become with the examples' defaults. Every namespace and process a test makes
is removed when it ends, whatever its outcome; without the rights to make namespaces the tests are skipped, saying so.
"""

import hashlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from megatron_neobert.checkpoint.integrity import MANIFEST
from megatron_neobert.checkpoint.layout import iteration_dir, read_latest_iteration
from megatron_neobert.training.resilience.guards.hosts import ANSWER_S
from megatron_neobert.training.resilience.guards.rules import MIN_WINDOW_STEPS, silent_bound
from megatron_neobert.parallel.launch import run_on_ranks
from pretrain_cases import run_train
from test_faults import IDLE_S, RESTARTED, Job, argv, logged, losses, restart_cost

pytestmark = pytest.mark.integration

ADDRESSES = {"a": "10.213.0.1", "b": "10.213.0.2"}
RENDEZVOUS_PORT = 29500
CHECK_S = 5  # --host-check-after-s
JOIN_S = 30  # how long host-a's torchrun waits in the rendezvous for a lost host under a fixed --nnodes
# A node missing 3 heartbeats of 1 s is gone; a round waits LAST_CALL_S for more nodes once it has enough (long enough
# for host-b's torchrun to start on busy cores: host-a would otherwise start alone, then restart for host-b).
LAST_CALL_S = 10
RDZV_CONF = (f"join_timeout={JOIN_S},last_call_timeout={LAST_CALL_S},keep_alive_interval=1,keep_alive_max_attempt=3,"
             f"read_timeout=60")
TRAIN = ["--train-iters", "24", "--log-interval", "1", "--save-interval", "5", "--host-check-after-s", str(CHECK_S)]
THAW_AFTER_S = silent_bound(CHECK_S) + 5  # a frozen host is thawed once stopped past the others' wait, with a margin
# The slow host: every log interval one of the straggler rule's windows; named after STRAGGLER_INTERVALS slow windows
# (--straggler-intervals' default) and drained at once (--straggler-exit-intervals as small as allowed).
STRAGGLER_INTERVALS = 3
SLOW = ["--train-iters", "64", "--log-interval", str(MIN_WINDOW_STEPS), "--save-interval", "1000",
        "--host-check-after-s", str(CHECK_S), "--straggler-exit-intervals", str(STRAGGLER_INTERVALS)]
STOPPED_S, PERIOD_S = 0.075, 0.1  # a throttled host: stopped 75% of each 100 ms, its rank at a quarter of its speed
THAWED = r"^error: rank \d: this host was stopped for \d+ s, longer than the other hosts wait before going on"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class TwoHosts:
    """The namespaces host-a and host-b (and the switch's); `job(host, ...)` starts a torchrun agent on a host."""

    def __init__(self):
        tag = f"nb56-{os.getpid()}"
        self.switch, self.ns = f"{tag}-sw", {host: f"{tag}-{host}" for host in ADDRESSES}
        self.jobs = []

    def make(self) -> None:
        for ns in [self.switch, *self.ns.values()]:
            ip("netns", "add", ns)
        for ns in self.ns.values():  # `ip netns exec` mounts /etc/netns/NS/hosts on /etc/hosts: the hosts' names
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as names:
                names.write("127.0.0.1 localhost\n" + "".join(f"{address} host-{host}\n"
                                                             for host, address in ADDRESSES.items()))
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for host, ns in self.ns.items():
            ip("link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", f"port-{host}", "netns",
               self.switch)
            ip("-n", ns, "addr", "add", f"{ADDRESSES[host]}/24", "dev", "eth0")
            for link in ("eth0", "lo"):
                ip("-n", ns, "link", "set", link, "up")
            ip("-n", self.switch, "link", "set", f"port-{host}", "master", "br0")
            ip("-n", self.switch, "link", "set", f"port-{host}", "up")

    def cut(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", f"port-{host}", "nomaster")

    def restore(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", f"port-{host}", "master", "br0")

    def pids(self, host: str) -> list:
        listed = subprocess.run(["ip", "netns", "pids", self.ns[host]], capture_output=True, text=True, timeout=30)
        return [int(pid) for pid in listed.stdout.split()]

    def signal(self, host: str, sig: int) -> None:
        for pid in self.pids(host):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def wait_until_empty(self, host: str, timeout: float) -> float:
        """Seconds until no process is left on `host`."""
        start = time.monotonic()
        while self.pids(host):
            assert time.monotonic() - start < timeout, (host, self.pids(host), self.outputs())
            time.sleep(0.2)
        return time.monotonic() - start

    def job(self, host: str, train_argv: list, nnodes: str) -> Job:
        launcher = ("--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"{ADDRESSES['a']}:{RENDEZVOUS_PORT}", "--rdzv-id", "rehearsal", "--rdzv-conf", RDZV_CONF)
        self.jobs.append(Job(train_argv, "--max-restarts", "1", launcher=launcher, prefix=self._on(host)))
        return self.jobs[-1]

    def _on(self, host: str) -> tuple:
        # unshare --uts: a host name of its own, as the error lines name hosts
        return ("ip", "netns", "exec", self.ns[host], "unshare", "--uts", "sh", "-c",
                f'hostname host-{host} && exec "$0" "$@"')

    def task(self, host: str, train_argv: list) -> Job:
        """The rank of `host` started as SLURM's one task per GPU is (examples/pretrain_neobert.slurm): no torchrun,
        the job's variables set as pretrain_neobert.sh sets them from SLURM's; rank 0 (host-a) holds the store."""
        variables = {"RANK": str("ab".index(host)), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                     "MASTER_ADDR": ADDRESSES["a"], "MASTER_PORT": str(RENDEZVOUS_PORT)}
        self.jobs.append(Job(train_argv, prefix=self._on(host), task=variables))
        return self.jobs[-1]

    def start(self, train_argv: list, nnodes: str) -> tuple:
        """The agents of host-a (first: it holds the rendezvous, and is node 0) and host-b, once both train."""
        a = self.job("a", train_argv, nnodes)
        deadline = time.monotonic() + 300
        while not re.search(rf":{RENDEZVOUS_PORT:04X} [0-9A-F]+:0000 0A ", self._listening()):  # 0A: LISTEN
            assert time.monotonic() < deadline and a.proc.poll() is None, a.output[-3000:]
            time.sleep(0.2)
        b = self.job("b", train_argv, nnodes)
        a.wait_for(r"layout: 2 ranks")
        return a, b

    def _listening(self) -> str:
        return subprocess.run(["ip", "netns", "exec", self.ns["a"], "cat", "/proc/net/tcp", "/proc/net/tcp6"],
                              capture_output=True, text=True, timeout=30).stdout

    def outputs(self) -> str:
        return "\n".join(f"--- host-{host}:\n{job.output[-3000:]}" for host, job in zip("ab", self.jobs))

    def remove(self) -> None:
        for host in self.ns:
            self.signal(host, signal.SIGKILL)  # a stopped process dies of it too
        for job in self.jobs:
            job.close()
        for ns in [*self.ns.values(), self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


@pytest.fixture
def hosts():
    made = TwoHosts()
    try:
        made.make()
    except (OSError, subprocess.CalledProcessError) as err:
        made.remove()
        reason = err.stderr.strip() if isinstance(err, subprocess.CalledProcessError) else err
        pytest.skip(f"network namespaces cannot be made here (root and iproute2 are needed): {reason}")
    yield made
    made.remove()


def first_line(job: Job, pattern: str, after: float, within: float) -> tuple:
    """(seconds from `after`, the line) of the first line matching `pattern`, waited for up to `within`."""
    at = job.time_of(pattern, after=after, timeout=within)
    line = next(line for t, line in zip(job.times, job.lines) if t >= at and re.search(pattern, line))
    return at - after, line.strip()


def written(*folders: str) -> dict:
    """Every folder and file under `folders`, with what a write changes: a folder's time (an entry made or removed), a
    file's size, time and SHA-256."""
    found = {}
    for folder in folders:
        for where, _, names in os.walk(folder):
            found[where] = os.stat(where).st_mtime_ns
            for name in names:
                path = os.path.join(where, name)
                with open(path, "rb") as content:
                    found[path] = (os.stat(path).st_size, os.stat(path).st_mtime_ns,
                                   hashlib.sha256(content.read()).hexdigest())
    return found


class Throttle:
    """Every process of `host` stopped STOPPED_S of each PERIOD_S from a thread of the test, as a throttled host runs
    (its processes listed again every second), until `stop`, which lets them all run."""

    def __init__(self, hosts: TwoHosts, host: str):
        self.hosts, self.host, self._stop = hosts, host, threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="throttle", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pids, listed = [], 0.0
        while not self._stop.is_set():
            if time.monotonic() - listed > 1:
                pids, listed = self.hosts.pids(self.host), time.monotonic()
            self._send(pids, signal.SIGSTOP)
            time.sleep(STOPPED_S)
            self._send(pids, signal.SIGCONT)
            self._stop.wait(PERIOD_S - STOPPED_S)

    @staticmethod
    def _send(pids: list, sig: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()
        self.hosts.signal(self.host, signal.SIGCONT)


def lost_host_line(host: str) -> str:
    # The fault comes after iteration 7 is logged; on busy cores the rank may be in iteration 10's save by then.
    return (rf"^error: rank \d: host host-{host} \({re.escape(ADDRESSES[host])}\) stopped answering at iteration "
            rf"\d+ \((training step|checkpoint save); no answer within {ANSWER_S:g} s after \d+ s without progress\)")


def test_a_link_cut_ends_both_hosts_jobs_within_the_bound_and_the_resume_is_exact(hosts, data, tmp_path):
    """--nnodes 2: host-b's rank finds the rendezvous host unreachable and ends its torchrun with it; host-a's finds
    host-b silent, its torchrun waits JOIN_S for host-b in a new round, then fails."""
    root = str(tmp_path / "ckpt")
    train = argv(data, *TRAIN, "--save", root, "--load", root)
    a, b = hosts.start(train, "2")
    a.wait_for(r"iteration +7/")  # past the checkpoint of iteration 5
    slowdown = a.slowdown()
    hosts.cut("b")
    cut = time.monotonic()
    detect = CHECK_S + ANSWER_S + 5 * slowdown  # the check waits CHECK_S, its answer ANSWER_S; the rest scales
    b_noticed, b_line = first_line(b, r"^error: ", cut, detect)
    assert re.match(rf"error: rank 1: the rendezvous host host-a \({re.escape(ADDRESSES['a'])}\) is unreachable at "
                    rf"iteration \d+ .*: this host is cut off from the job; ending this attempt and torchrun \(pid "
                    rf"{b.proc.pid}\)", b_line), b_line
    a_noticed, a_line = first_line(a, r"^error: ", cut, detect)
    assert re.match(lost_host_line("b"), a_line), a_line
    assert b.proc.wait(timeout=5 * slowdown) == -signal.SIGKILL
    hosts.wait_until_empty("b", 5 * slowdown)  # its rank's data workers and checkpoint writers too
    b_ended = time.monotonic() - cut
    assert a.proc.wait(timeout=a_noticed + JOIN_S + 10 * slowdown) != 0
    hosts.wait_until_empty("a", 5 * slowdown)
    a_ended = time.monotonic() - cut
    print(f"link cut after iteration 7 (slowdown {slowdown:.1f}): host-b noticed at +{b_noticed:.1f} s "
          f"({b_line!r}), its processes all ended by +{b_ended:.1f} s; host-a noticed at +{a_noticed:.1f} s "
          f"({a_line!r}), its torchrun ended after the rendezvous' {JOIN_S} s at +{a_ended:.1f} s")
    assert a_ended < detect + JOIN_S + 15 * slowdown
    latest = read_latest_iteration(root)
    assert latest in (5, 10) and os.path.isfile(os.path.join(iteration_dir(root, latest), MANIFEST))
    hosts.restore("b")
    resumed = run_on_ranks(run_train, 2, argv(data, *TRAIN, "--load", root))[0]
    uninterrupted = run_on_ranks(run_train, 2, argv(data, *TRAIN))[0]
    assert losses(resumed) == losses(uninterrupted, latest)


def test_slurm_tasks_cut_apart_both_end_within_the_bound_and_the_requeue_resumes_exactly(hosts, data, tmp_path):
    """One task per host as SLURM starts them (no torchrun; rank 0 on host-a holds the store): a link cut ends both
    tasks with their lines (srun --kill-on-bad-exit would end the step), and the requeued job, the same two tasks
    started again once the link is back, resumes from the marker's checkpoint with the uninterrupted losses."""
    root = str(tmp_path / "ckpt")
    train = argv(data, *TRAIN, "--save", root, "--load", root)
    a = hosts.task("a", train)
    b = hosts.task("b", train)
    a.wait_for(r"iteration +7/")
    slowdown = a.slowdown()
    hosts.cut("b")
    cut = time.monotonic()
    detect = CHECK_S + ANSWER_S + 5 * slowdown
    b_noticed, b_line = first_line(b, r"^error: ", cut, detect)
    assert re.match(rf"error: rank 1: the rendezvous host host-a \({re.escape(ADDRESSES['a'])}\) is unreachable at "
                    rf"iteration \d+ .*: this host is cut off from the job; ending this attempt$", b_line), b_line
    a_noticed, a_line = first_line(a, r"^error: ", cut, detect)
    assert re.match(lost_host_line("b") + r"; ending this attempt \(srun --kill-on-bad-exit ends the job step; its "
                    r"requeue resumes from the latest checkpoint\)$", a_line), a_line
    assert a.proc.wait(timeout=5 * slowdown) == 1 and b.proc.wait(timeout=5 * slowdown) == 1
    for host in "ab":
        hosts.wait_until_empty(host, 5 * slowdown)
    ended = time.monotonic() - cut
    print(f"SLURM tasks, link cut after iteration 7 (slowdown {slowdown:.1f}): host-b noticed at +{b_noticed:.1f} s "
          f"({b_line!r}); host-a noticed at +{a_noticed:.1f} s ({a_line!r}); every process of both ended by "
          f"+{ended:.1f} s")
    assert ended < detect + 5 * slowdown
    latest = read_latest_iteration(root)
    assert latest in (5, 10) and os.path.isfile(os.path.join(iteration_dir(root, latest), MANIFEST))
    hosts.restore("b")
    requeued = [hosts.task(host, train) for host in "ab"]
    assert [task.proc.wait(timeout=600) for task in requeued] == [0, 0], hosts.outputs()
    uninterrupted = run_on_ranks(run_train, 2, argv(data, *TRAIN))[0]
    assert requeued[0].logged_losses() == logged(uninterrupted, latest)


@pytest.mark.parametrize("fault", ["frozen", "killed"])
def test_a_lost_host_leaves_the_other_to_go_on_alone_within_the_bound(fault, hosts, data, tmp_path):
    """--nnodes 1:2. frozen: every process of host-b SIGSTOPped (its kernel still accepts connections, nothing
    answers); killed: host-b's link cut and every process killed (a host that loses power sends nothing). host-a's
    rank names host-b and ends; its torchrun goes on alone from the latest checkpoint, the losses those of a 1-rank
    run from it."""
    root, reference_root = str(tmp_path / "ckpt"), str(tmp_path / "reference")
    train = argv(data, *TRAIN, "--save", root, "--load", root)
    a, b = hosts.start(train, "1:2")
    a.wait_for(r"iteration +7/")
    slowdown = a.slowdown()
    if fault == "killed":
        hosts.cut("b")
        hosts.signal("b", signal.SIGKILL)
    else:
        hosts.signal("b", signal.SIGSTOP)
    fault_at = time.monotonic()
    detect = CHECK_S + ANSWER_S + 5 * slowdown
    noticed, line = first_line(a, r"^error: ", fault_at, detect)
    assert re.match(lost_host_line("b"), line), line
    resumed, redone, lost_s, to_first_step = restart_cost(a, fault_at)
    restarted = a.time_of(RESTARTED)
    print(f"host-b {fault} after iteration 7 (slowdown {slowdown:.1f}): host-a noticed at +{noticed:.1f} s "
          f"({line!r}), went on alone from iteration {resumed}: first step at +{to_first_step:.1f} s")
    # The check, then a rendezvous without host-b (3 heartbeats, the last call) and a start.
    assert to_first_step < detect + 3 + LAST_CALL_S + 3 * IDLE_S["first step"] * slowdown
    if fault == "frozen":  # thawed while host-a goes on: host-b ends by itself and does not rejoin (the losses below)
        hosts.signal("b", signal.SIGCONT)
        thawed = time.monotonic()
        ended_s, b_line = first_line(b, THAWED, thawed, 60)
        hosts.wait_until_empty("b", 60)
        print(f"host-b thawed at +{thawed - fault_at:.1f} s: {b_line!r} at +{ended_s:.1f} s after the thaw, every "
              f"process ended by +{time.monotonic() - thawed:.1f} s")
    assert "world size 2 -> 1: gradient accumulation 2 -> 4" in a.output
    assert a.proc.wait(timeout=600) == 0, hosts.outputs()
    if fault == "killed":
        assert not hosts.pids("b")
    reference = run_on_ranks(run_train, 1, [*argv(data, *TRAIN), "--load", root, "--ckpt-step", str(resumed),
                                            "--save", reference_root])[0]
    assert a.logged_losses(after=restarted) == logged(reference, resumed)


@pytest.mark.parametrize("frozen", ["a", "b"], ids=["the store's host", "the other host"])
def test_a_frozen_host_under_a_fixed_size_ends_the_job_within_the_bound_and_thawed_writes_nothing(frozen, hosts, data,
                                                                                                  tmp_path):
    """--nnodes 2, every process of one host frozen (SIGSTOPped); the other host's ranks find it silent though its
    kernel accepts their connections, and name it. a: host-a, whose torchrun holds the rendezvous store and whose
    rank is rank 0: host-b's rank ends its torchrun, which would wait on the frozen store, so host-b is empty within a
    cut link's bound. b: host-b, the other host: host-a's rank ends the attempt, and its torchrun, after a round that
    waits JOIN_S for host-b, fails. Thawed once stopped past the others' wait (and the other host empty), the frozen
    host's rank ends at once with its torchrun, and writes nothing: the save folder (checkpoints, marker, goodput
    account, the --save lock) and the TensorBoard folder are as the other host left them, to the byte."""
    other = "b" if frozen == "a" else "a"
    root, board = str(tmp_path / "ckpt"), str(tmp_path / "tensorboard")
    jobs = dict(zip("ab", hosts.start(argv(data, *TRAIN, "--save", root, "--load", root, "--tensorboard-dir", board),
                                      "2")))
    jobs["a"].wait_for(r"iteration +7/")
    slowdown = jobs["a"].slowdown()
    hosts.signal(frozen, signal.SIGSTOP)
    stopped = time.monotonic()
    detect = CHECK_S + ANSWER_S + 5 * slowdown
    noticed, line = first_line(jobs[other], r"^error: ", stopped, detect)
    if frozen == "a":
        assert re.match(rf"error: rank 1: the rendezvous host host-a \({re.escape(ADDRESSES['a'])}\) stopped answering "
                        rf"at iteration \d+ .*; the job cannot go on without its store: ending this attempt and "
                        rf"torchrun \(pid {jobs['b'].proc.pid}\)", line), line
        assert jobs["b"].proc.wait(timeout=5 * slowdown) == -signal.SIGKILL
        bound = detect + 5 * slowdown
    else:  # the rendezvous goes on on host-a: its torchrun restarts the rank, waits JOIN_S for host-b, and fails
        assert re.match(lost_host_line("b"), line), line
        assert jobs["a"].proc.wait(timeout=noticed + JOIN_S + 10 * slowdown) != 0
        bound = detect + JOIN_S + 15 * slowdown
    hosts.wait_until_empty(other, 5 * slowdown)  # its rank's data workers and checkpoint writers too
    ended = time.monotonic() - stopped
    assert ended < bound
    before = written(root, board)
    time.sleep(max(0.0, stopped + THAW_AFTER_S - time.monotonic()))
    hosts.signal(frozen, signal.SIGCONT)
    thawed = time.monotonic()
    thawed_s, thawed_line = first_line(jobs[frozen], THAWED, thawed, 60)
    assert thawed_line.startswith(f"error: rank {'ab'.index(frozen)}: ") and thawed_line.endswith(
        f"ending this attempt and torchrun (pid {jobs[frozen].proc.pid}) without writing anything (start it again to "
        f"rejoin the job)"), thawed_line
    hosts.wait_until_empty(frozen, 60)
    frozen_ended = time.monotonic() - thawed
    print(f"host-{frozen} ({'the store' if frozen == 'a' else 'not the store'}'s host) frozen under --nnodes 2 after "
          f"iteration 7 (slowdown {slowdown:.1f}): host-{other} noticed at +{noticed:.1f} s ({line!r}), every "
          f"process of it ended by +{ended:.1f} s; host-{frozen} thawed at +{thawed - stopped:.1f} s: "
          f"{thawed_line!r} at +{thawed_s:.1f} s after the thaw, every process ended by +{frozen_ended:.1f} s")
    assert before and written(root, board) == before


def test_a_slow_host_is_named_and_drained_and_the_other_goes_on_alone_from_the_checkpoint(hosts, data, tmp_path):
    """--nnodes 1:2, --log-interval 8 (every interval a window of the straggler rule), --straggler-exit-intervals 3:
    from iteration 9 every process of host-b is stopped 75% of each 100 ms (a throttled host). host-a's rank 0 names
    rank 1 on host-b once its third slow window is judged, at the end of the interval after it; every rank learns of
    the drain at the next interval's end and saves; host-b's rank ends its torchrun (which would restart it into the
    next round) and its part of the job with the line naming the host to drain; host-a's rank ends the attempt and its
    torchrun goes on alone from that checkpoint, at world size 1, to the run's end. Neither host's check of the other
    (--host-check-after-s 5) fires: a throttled host answers. The goodput table names the drained host."""
    root = str(tmp_path / "ckpt")
    a, b = hosts.start(argv(data, *SLOW, "--save", root, "--load", root), "1:2")
    a.wait_for(rf"iteration +{MIN_WINDOW_STEPS}/")  # the start-up interval, not judged, is over
    throttle = Throttle(hosts, "b")
    try:
        assert b.proc.wait(timeout=600) == -signal.SIGKILL, hosts.outputs()  # its rank ended it, then says why
        hosts.wait_until_empty("b", 30)
    finally:
        throttle.stop()
    b_empty = time.monotonic() - throttle.started
    b.wait_for(r"(?m)^error: ", timeout=10)  # the reader may still hold the last lines
    b_ended = b.time_of(r"^error: ", after=throttle.started, timeout=5) - throttle.started
    warnings = [line.strip() for line in a.lines if re.search(
        r"warning: straggler: rank 1 on host host-b computes [\d.]+ ms a step, [\d.]+x the median of the other ranks, "
        r"since iteration \d+: the job's steps take \d+% longer than without it", line)]
    assert len(warnings) == 1, a.output[-6000:]
    warning = warnings[0]
    warned_at = max(int(m.group(1)) for line in a.lines[:[line.strip() for line in a.lines].index(warning)]
                    for m in [re.search(r"iteration +(\d+)/", line)] if m)
    since = int(re.search(r"since iteration (\d+)", warning).group(1))
    drained_at = warned_at + MIN_WINDOW_STEPS
    b_error = b.first_error()
    assert b_error == (f"error: rank 1: this host (host-b) is the straggler, slow for {STRAGGLER_INTERVALS} judged "
                       f"windows in a row (--straggler-exit-intervals): its part of the job ends at iteration "
                       f"{drained_at}; drain host host-b"), hosts.outputs()
    # Named at the end of the interval after its third slow window (9-16, 17-24, 25-32: at 40) and drained at the
    # next (48); a busy machine may start the count again (a later window), never bring it forward: named within 5
    # intervals of the throttle's start (one restart of the count), drained within 6, before the run's end (64).
    assert MIN_WINDOW_STEPS < since and warned_at == since - 1 + (STRAGGLER_INTERVALS + 1) * MIN_WINDOW_STEPS
    assert warned_at <= MIN_WINDOW_STEPS + (STRAGGLER_INTERVALS + 2) * MIN_WINDOW_STEPS, warning
    assert re.search(rf"^error: host host-b ended its part of the job as the straggler at iteration {drained_at}: "
                     rf"drain it; ending this attempt", a.output, re.M), a.output[-6000:]
    restarted = a.wait_for(RESTARTED)  # said at the first step alone (with the start-up line)
    resumed, redone = int(restarted.group(1)), int(restarted.group(2))
    first_step = a.time_of(RESTARTED) - throttle.started
    assert resumed == drained_at and redone == 0
    assert "world size 2 -> 1: gradient accumulation 2 -> 4" in a.output
    assert a.proc.wait(timeout=600) == 0, hosts.outputs()
    assert not [line for line in a.lines + b.lines if re.search(r"stopped answering|this host was stopped|watchdog:",
                                                                   line)], hosts.outputs()
    table = a.output[a.output.rindex("where the job's time went"):]  # the end-of-run goodput table
    straggler_row = next(line for line in table.splitlines() if line.startswith("waiting for a straggler"))
    waited = re.match(r"waiting for a straggler \(within the steps\) +([\d,.]+) ", straggler_row)
    assert straggler_row.endswith("drained: host-b") and float(waited.group(1).replace(",", "")) > 0, table
    assert re.search(r"total \(wall time since the job's first start\) .* 2 attempt\(s\)", table), table
    failures = next(line for line in table.splitlines() if line.startswith("between attempts"))
    print(f"host-b throttled (stopped {STOPPED_S * 1000:.0f} of each {PERIOD_S * 1000:.0f} ms) from iteration "
          f"{MIN_WINDOW_STEPS + 1}: host-a named it at iteration {warned_at} ({warning!r}), slow since "
          f"{since}; host-b's line at iteration {drained_at}, +{b_ended:.1f} s ({b_error!r}), every process of it "
          f"ended by +{b_empty:.1f} s; host-a went on alone from iteration {resumed}: first step at +{first_step:.1f} "
          f"s, its run ended with exit 0. Goodput: {straggler_row.strip()!r}; {failures.strip()!r}")


def test_a_link_restored_before_the_check_lets_the_job_go_on(hosts, data, tmp_path):
    """A link down for 2 s (a flap) under --nnodes 2: TCP resends what was lost, the check (if the wait reaches it)
    finds every host answering, and the run ends as the uninterrupted one, without an error."""
    root = str(tmp_path / "ckpt")
    a, b = hosts.start(argv(data, *TRAIN, "--save", root), "2")
    a.wait_for(r"iteration +7/")
    hosts.cut("b")
    time.sleep(2)
    hosts.restore("b")
    assert a.proc.wait(timeout=600) == 0 and b.proc.wait(timeout=60) == 0, hosts.outputs()
    assert not a.first_error() and not b.first_error(), hosts.outputs()
    uninterrupted = run_on_ranks(run_train, 2, argv(data, *TRAIN))[0]
    assert a.logged_losses() == logged(uninterrupted, 0)
