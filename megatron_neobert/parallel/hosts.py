"""Whether the job's other hosts still answer: how a rank that waits tells a partition from a straggler.

A rank that waits in a collective cannot tell a slow peer (a long step, save or evaluation) from a lost one (a host
cut off from the network, powered off or frozen): gloo has no heartbeat, and NCCL's watchdog waits for the same
timeout as the collective. So every rank answers on a port of its own (`HostAnswers`, a thread that echoes one byte),
and the ranks swap their hosts' names, addresses and ports once the process group exists. When the progress watchdog
sees no progress, it asks one rank of every other host, and the rendezvous store (MASTER_ADDR:MASTER_PORT), for an
answer within ANSWER_S: a straggler's host answers (its answering thread runs while its main thread computes or
waits), a host cut off, powered off or frozen does not.

A host whose kernel refuses the connection answered: its rank is gone, which the collective reports by itself at once.
"""

import concurrent.futures
import dataclasses
import os
import socket
import threading
from typing import List, Optional

import torch

ANSWER_S = 5.0  # a reachable host answers within milliseconds; a SYN or a byte lost once is resent within 3 s
_PROBE = b"?"


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int  # where one of its ranks answers (None: the rendezvous store, which only accepts connections)
    rank: Optional[int]


def answers(address: str, port: int, echo: bool, timeout: float = ANSWER_S) -> bool:
    """Whether the host at `address` answers within `timeout`: it accepts a connection on `port` (and echoes a byte,
    with `echo`), or its kernel refuses the connection (the host is up, the process gone)."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            if echo:
                conn.sendall(_PROBE)
                return conn.recv(1) == _PROBE
            return True
    except ConnectionRefusedError:
        return True
    except OSError:  # timed out, no route to the host, reset mid-way
        return False


def local_address(towards: str, port: int) -> str:
    """The address of this host that packets to `towards` leave from (what the other hosts reach it at). A UDP
    socket's connect only chooses the route: nothing is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((towards, port))
        return probe.getsockname()[0]


class HostAnswers:
    """This rank's answering thread, and the job's other hosts, learnt from every rank (a collective: create it on
    every rank of the process group)."""

    def __init__(self):
        self.server = socket.create_server(("0.0.0.0", 0), backlog=64)
        threading.Thread(target=self._answer, name="host-answers", daemon=True).start()
        master, master_port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
        self.master = socket.gethostbyname(master)  # resolved now: a name server may be out of reach later
        self.master_port = master_port
        self.address = local_address(self.master, master_port or 1)
        mine = Host(socket.gethostname(), self.address, self.server.getsockname()[1], torch.distributed.get_rank())
        everyone: List[Host] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, mine)
        others = {}
        for host in everyone:  # one rank per host (its lowest) answers for it
            if host.address != self.address and host.address not in others:
                others[host.address] = host
        self.others = list(others.values())
        self.rendezvous = others.get(self.master) or Host(master, self.master, master_port, None)

    def _answer(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            # Each asker on a thread of its own: one cut off half-way must not keep the others waiting.
            threading.Thread(target=_echo, args=(conn,), name="host-answer", daemon=True).start()

    def silent(self) -> List[Host]:
        """The other hosts that do not answer now (asked at once; within ANSWER_S); the rendezvous host among them
        when its store does not accept a connection either (a host whose ranks are all on other hosts' is asked
        through its store alone)."""
        if not self.others and self.master == self.address:
            return []
        asked = list(self.others)
        store_asked = self.master != self.address and self.master_port
        with concurrent.futures.ThreadPoolExecutor(min(64, len(asked) + 1)) as pool:
            replies = list(pool.map(lambda host: answers(host.address, host.port, echo=True), asked))
            store = answers(self.master, self.master_port, echo=False) if store_asked else True
        silent = [host for host, answered in zip(asked, replies) if not answered]
        if not store and self.rendezvous not in silent:
            silent.append(self.rendezvous)
        return silent

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
