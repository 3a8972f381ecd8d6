"""The store on which one attempt of a torchrun job creates its process groups.

torchrun's agent hosts a TCPStore for the whole job and hands it to the workers
(TORCHELASTIC_USE_AGENT_STORE=True: static rendezvous always, c10d unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1).
When it restarts the workers (--max-restarts, a lost or returning node), the new ones meet on the same store, where
torch's process groups find the keys of the previous attempt under the same names (each gloo rank's address, NCCL's
unique id): they connect to ranks that are gone ("Gloo connectFullMesh failed ... Connection refused") or wait for
ever. TORCHELASTIC_RESTART_COUNT cannot name the attempt: each agent counts only its own restarts, so after a node
rejoins, the counts differ between nodes.

So the workers of an attempt agree on a name of their own: rank 0 draws one and publishes it; every other rank
answers the published name with a nonce and goes on once rank 0 confirms that nonce. A name a dead attempt left
behind is never confirmed, so a rank that read it reads again until rank 0 of its own attempt has published. The
process groups then live under that name (`torch.distributed.PrefixStore`), and the job's store stays usable for
what outlives an attempt (`JOB_PREFIX`).
"""

import os
import time
import uuid
from datetime import timedelta

import torch

JOB_PREFIX = "megatron_neobert"
_ATTEMPT_KEY = f"{JOB_PREFIX}/attempt"
_POLL_S = 0.1  # how often a rank that waits for rank 0's answer looks again


def uses_agent_store() -> bool:
    """Whether this process was started by a torchrun agent that shares its store with the workers."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def agent_store(timeout: timedelta) -> torch.distributed.TCPStore:
    """A client of the agent's store (MASTER_ADDR:MASTER_PORT), as torch's env:// rendezvous connects to it."""
    return torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                      timeout=timeout)


def agree_on_attempt(store: torch.distributed.Store, rank: int, world_size: int, timeout: timedelta) -> str:
    """Collective over the store: the name this attempt's ranks agree on (see the module's docstring)."""
    if rank == 0:
        name = uuid.uuid4().hex
        store.set(_ATTEMPT_KEY, name)
        hellos = [f"{JOB_PREFIX}/{name}/hello/{other}" for other in range(1, world_size)]
        if hellos:
            store.wait(hellos)  # up to the store's timeout
            store.multi_set([f"{JOB_PREFIX}/{name}/welcome/{nonce.decode()}" for nonce in store.multi_get(hellos)],
                            ["1"] * len(hellos))
        return name
    nonce, answered, deadline = uuid.uuid4().hex, None, time.monotonic() + timeout.total_seconds()
    while True:
        name = store.get(_ATTEMPT_KEY).decode()  # waits for the first attempt's rank 0
        if name != answered:
            store.set(f"{JOB_PREFIX}/{name}/hello/{rank}", nonce)
            answered = name
        # Polled: a store wait that times out has torch print a warning each time.
        if store.check([f"{JOB_PREFIX}/{name}/welcome/{nonce}"]):
            return name
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 of this torchrun attempt did not answer within "
                               f"{timeout.total_seconds():.0f} s on the store {os.environ.get('MASTER_ADDR')}:"
                               f"{os.environ.get('MASTER_PORT')} (the last name it published: {name})")
        time.sleep(_POLL_S)


def attempt_store(rank: int, world_size: int, timeout: timedelta) -> torch.distributed.Store:
    """The agent's store, under the name this attempt's ranks agree on."""
    store = agent_store(timeout)
    return torch.distributed.PrefixStore(f"{JOB_PREFIX}/{agree_on_attempt(store, rank, world_size, timeout)}",
                                         store)
