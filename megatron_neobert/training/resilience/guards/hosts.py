"""Whether the job's other hosts still answer: how a rank that waits tells a partition from a straggler.

A rank that waits in a collective cannot tell a slow peer (a long step, save or evaluation) from a lost one (a host
cut off from the network, powered off or frozen): gloo has no heartbeat, and NCCL's watchdog waits for the same
timeout as the collective. So every rank answers on a port of its own (`HostAnswers`, a thread that echoes one byte),
and the ranks swap their hosts' names, addresses and ports once the process group exists. When the progress watchdog
sees no progress, it asks a few ranks on other hosts, and the rendezvous store (MASTER_ADDR:MASTER_PORT), for an
answer within ANSWER_S: a straggler's host answers (its answering thread runs while its main thread computes or
waits), a host cut off, powered off or frozen does not. The store is asked as torch's own clients would ask it (a
ping): the kernel of a frozen host still accepts connections, so only a reply shows that the store's process runs.

Who asks whom (`asked_by`): the hosts form a ring in rank order, and each rank asks the rank of the same local index
on the host before and after its own, and the store. Every host is asked by each of its neighbours' ranks, and a
check costs 3 connections per rank whatever the job's size: at 1,000 hosts of 8 ranks, 24,000 every round, where
asking every host would take 8 million. A host that loses a neighbour names it and ends the attempt; the other hosts'
ranks end with it (torchrun restarts every agent's workers when one agent's fail).

A host whose kernel refuses the connection answered: its rank is gone, which the collective reports by itself at once.
One whose kernel accepts the connection and then says nothing is reached but frozen (its processes stopped, or hung);
one that does not even accept it is unreachable. A rank that reaches none of those it asks is the one cut off.
"""

import concurrent.futures
import dataclasses
import os
import socket
import struct
import threading
from typing import Dict, List, Optional, Sequence

import torch

ANSWER_S = 5.0  # a reachable host answers within milliseconds; a SYN or a byte lost once is resent within 3 s
_PROBE = b"?"
# torch's TCPStore wire format (torch/include/torch/csrc/distributed/c10d/TCPStoreBackend.hpp): a VALIDATE query (0)
# with the validation magic number, then a PING (13) with a nonce, which both of its servers (libuv and the classic
# one) send back. Any reply, or the connection closed by the server, shows that the store's process runs: a change of
# the format could not make a running store look frozen.
STORE_PING = struct.pack("=BIBI", 0, 0x3C85F7CE, 13, 0x6E656F62)
ANSWERED, FROZEN, UNREACHABLE = "answered", "frozen", "unreachable"


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int  # where one of its ranks answers, or the rendezvous store's MASTER_PORT
    rank: Optional[int]  # None for the rendezvous store's host when no rank runs there


def reply(address: str, port: int, request: bytes, timeout: float = ANSWER_S) -> str:
    """How the host at `address` meets `request` sent to `port` within `timeout`: ANSWERED (any reply, the connection
    closed by its process, or refused by its kernel: the host is up, the process gone), FROZEN (its kernel accepted the
    connection, nothing came back: the process is stopped or hung) or UNREACHABLE (no connection: cut off, powered
    off)."""
    try:
        conn = socket.create_connection((address, port), timeout=timeout)
    except ConnectionRefusedError:
        return ANSWERED
    except OSError:  # timed out, no route to the host
        return UNREACHABLE
    with conn:
        try:
            conn.sendall(request)
            conn.recv(1)  # a byte, or b"" where the process closed the connection
            return ANSWERED
        except socket.timeout:
            return FROZEN
        except OSError:  # reset by the process
            return ANSWERED


def answers(address: str, port: int, timeout: float = ANSWER_S) -> bool:
    """Whether the rank answering at `address`:`port` (`HostAnswers`) answers within `timeout`."""
    return reply(address, port, _PROBE, timeout) == ANSWERED


def local_address(towards: str, port: int) -> str:
    """The address of this host that packets to `towards` leave from (what the other hosts reach it at). A UDP
    socket's connect only chooses the route: nothing is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((towards, port))
        return probe.getsockname()[0]


def asked_by(everyone: Sequence[Host], rank: int) -> List[Host]:
    """The ranks that `rank` asks (`everyone`: one Host per rank, in rank order): on the host before and the host after
    its own in the ring of hosts (ordered by their lowest rank), the rank of the same local index (its index there
    modulo that host's ranks); none on a job of one host."""
    ring: Dict[str, List[Host]] = {}
    for host in everyone:
        ring.setdefault(host.address, []).append(host)
    hosts = list(ring.values())
    mine = next(i for i, ranks in enumerate(hosts) if any(host.rank == rank for host in ranks))
    local = next(i for i, host in enumerate(hosts[mine]) if host.rank == rank)
    asked = []
    for step in (1, -1):
        ranks = hosts[(mine + step) % len(hosts)]
        if ranks is not hosts[mine] and ranks[local % len(ranks)] not in asked:
            asked.append(ranks[local % len(ranks)])
    return asked


@dataclasses.dataclass(frozen=True)
class Answers:
    """What one check found: the asked ranks' hosts that did not answer, whether the rendezvous store did not, and
    whether any of those silent accepted the connection (a frozen host's kernel does; that of a host out of reach
    cannot)."""
    silent: List[Host]
    store_silent: bool
    asked: int
    reached: bool = False

    @property
    def someone_silent(self) -> bool:
        """An asked rank's host, or the rendezvous store, did not answer."""
        return bool(self.silent) or self.store_silent

    @property
    def cut_off(self) -> bool:
        """This host is the one cut off: neither the store nor any asked rank answered, and none of them accepted the
        connection. Where one of them did, the hosts that did not are the lost ones (the store's among them)."""
        return self.store_silent and len(self.silent) == self.asked and not self.reached


class HostAnswers:
    """This rank's answering thread, and the ranks it asks (`asked_by`), learnt from every rank (a collective: create
    it on every rank of the process group)."""

    def __init__(self):
        self.server = socket.create_server(("0.0.0.0", 0), backlog=64)
        threading.Thread(target=self._answer, name="host-answers", daemon=True).start()
        master, master_port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
        self.master = socket.gethostbyname(master)  # resolved now: a name server may be out of reach later
        self.master_port = master_port
        self.address = local_address(self.master, master_port or 1)
        rank = torch.distributed.get_rank()
        mine = Host(socket.gethostname(), self.address, self.server.getsockname()[1], rank)
        everyone: List[Host] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, mine)
        self.others = asked_by(everyone, rank)
        self.rendezvous = next((host for host in everyone if host.address == self.master),
                               Host(master, self.master, master_port, None))

    def _answer(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            # Each asker on a thread of its own: one cut off half-way must not keep the others waiting.
            threading.Thread(target=_echo, args=(conn,), name="host-answer", daemon=True).start()

    def ask(self) -> "Answers":
        """Asks the ranks of `others` and the rendezvous store at once; waits at most ANSWER_S."""
        store_asked = self.master != self.address and self.master_port
        if not self.others and not store_asked:
            return Answers([], False, 0)
        with concurrent.futures.ThreadPoolExecutor(len(self.others) + 1) as pool:  # all at once: one wait in all
            store = pool.submit(reply, self.master, self.master_port, STORE_PING) if store_asked else None
            replies = list(pool.map(lambda host: reply(host.address, host.port, _PROBE), self.others))
            store_reply = store.result() if store else ANSWERED
        return Answers([host for host, got in zip(self.others, replies) if got != ANSWERED], store_reply != ANSWERED,
                       len(self.others), reached=FROZEN in (store_reply, *replies))

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the answering thread, which ends
        self.server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(ANSWER_S)
        try:
            if conn.recv(1) == _PROBE:
                conn.sendall(_PROBE)
        except OSError:  # the asker gave up
            pass
