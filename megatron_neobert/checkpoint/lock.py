"""Who may write to a --save folder: one live run at a time, and only its own checkpoints.

`{save}/writer.lock` names the run that writes there (host, pid, the process's start time as
the kernel counts it, when it started, and torchrun's run id). A second run is refused while the owner lives; on
the same host "lives" means a process with that pid *and* that start time (a recycled pid is
not the owner), so the lock of a run killed with -9 is taken over. From another host the owner's
state cannot be seen: the run is refused, naming the owner, unless --break-save-lock is given, or unless the owner
was an earlier attempt of the same torchrun run (the same TORCHELASTIC_RUN_ID: torchrun restarts a job's workers
only once they are all stopped, so a lock that an attempt on a lost node held does not stop the survivors).

A --save that already holds checkpoints belongs to another run unless this run resumes from it
(--load is the same folder): a fresh run would overwrite its iterations and move its marker
back. It is refused unless --overwrite-save is given, which deletes those checkpoints first.
"""

import datetime
import json
import logging
import os
import shutil
import socket
import uuid
from typing import Optional

import torch

from megatron_neobert.checkpoint.layout import (LATEST_MARKER, iteration_dir, read_latest_iteration,
                                                         saved_iterations)
from megatron_neobert.errors import TrainingError
from megatron_neobert.processes import process_start_ticks

logger = logging.getLogger(__name__)

LOCK_NAME = "writer.lock"


def torchrun_run_id() -> Optional[str]:
    """The run id torchrun gives every attempt of one job, or None outside torchrun or where it names no job
    (static rendezvous without --rdzv-id gives every job "none")."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return run_id if run_id and run_id != "none" else None


def _owner_record() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start_ticks": process_start_ticks(pid),
            "started": datetime.datetime.now().isoformat(timespec="seconds"), "torchrun_run_id": torchrun_run_id()}


def _describe(owner: dict) -> str:
    return f"pid {owner.get('pid')} on host {owner.get('host')} (started {owner.get('started')})"


def _missing_folders(path: str) -> list:
    """The folders of `path` that do not exist yet, deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


class SaveLock:
    """Held by rank 0 for the whole run; `release()` removes the lock if it is still ours, and the folders the lock
    made if the run left nothing in them (a run refused after its start leaves no empty --save behind)."""

    def __init__(self, save: str, break_lock: bool = False):
        self.path = os.path.join(save, LOCK_NAME)
        self.made = _missing_folders(save)
        os.makedirs(save, exist_ok=True)
        self.record = _owner_record()
        for _ in range(2):
            if self._create():
                return
            owner = self._read()
            reason = self._stale_because(owner, break_lock)
            if reason is None:
                raise TrainingError(f"{save} is being written by another run, {_describe(owner)}; stop it "
                                    f"first, or save elsewhere")
            logger.warning(f"{self.path}: taking over the lock of {_describe(owner)}, {reason}")
            try:  # a rename is atomic: of two runs taking over at once, one wins
                os.replace(self.path, f"{self.path}.stale-{uuid.uuid4().hex[:8]}")
            except FileNotFoundError:
                continue
        if not self._create():
            raise TrainingError(f"{self.path}: another run took the lock at the same time")

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(self.record, f)
        for stale in [n for n in os.listdir(os.path.dirname(self.path)) if n.startswith(LOCK_NAME + ".stale-")]:
            os.remove(os.path.join(os.path.dirname(self.path), stale))
        return True

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (ValueError, FileNotFoundError):
            return {}  # half-written by a process killed while creating it, or just released

    def _stale_because(self, owner: dict, break_lock: bool) -> Optional[str]:
        """Why the owner no longer writes here, or None while it may."""
        if not owner.get("pid"):
            return "which never finished writing it"
        if owner.get("host") == self.record["host"]:
            alive = process_start_ticks(int(owner["pid"])) == owner.get("start_ticks")
            return None if alive else "which is no longer running"
        run_id = self.record["torchrun_run_id"]
        if run_id is not None and owner.get("torchrun_run_id") == run_id:
            return f"an earlier attempt of this torchrun run ({run_id})"
        if break_lock:
            return "as --break-save-lock asks"
        raise TrainingError(f"{self.path} is held by {_describe(owner)}; this host cannot tell whether "
                            f"that process still runs: if it does not, pass --break-save-lock")

    def release(self) -> None:
        if self._read() == self.record:
            os.remove(self.path)
        for folder in self.made:
            try:
                os.rmdir(folder)
            except OSError:  # the run wrote something there (or another run did): it stays
                break


def holds_checkpoints(save: str) -> bool:
    return os.path.isdir(save) and (read_latest_iteration(save) is not None or bool(saved_iterations(save)))


def check_save_is_ours(save: str, load: Optional[str], overwrite: bool) -> None:
    """Rank 0: refuse (or with `overwrite` clear) a --save holding another run's checkpoints."""
    if not holds_checkpoints(save) or (load and os.path.realpath(load) == os.path.realpath(save)):
        return
    iterations = saved_iterations(save)
    if not overwrite:
        raise TrainingError(f"--save {save} holds another run's checkpoints (iterations {iterations}, "
                            f"latest {read_latest_iteration(save)}); resume from them with --load {save}, "
                            f"save elsewhere, or pass --overwrite-save to delete them")
    logger.warning(f"--overwrite-save: deleting the checkpoints of iterations {iterations} in {save}")
    marker = os.path.join(save, LATEST_MARKER)
    if os.path.exists(marker):
        os.remove(marker)  # first: the folders are no longer complete checkpoints
    for it in iterations:
        shutil.rmtree(iteration_dir(save, it))


def claim_save_dir(args) -> Optional[SaveLock]:
    """Collective: rank 0 takes --save's lock and checks the folder is this run's; every rank
    raises the same error when it cannot."""
    if not args.save:
        return None
    lock, error = None, None
    if torch.distributed.get_rank() == 0:
        try:
            lock = SaveLock(args.save, args.break_save_lock)
            check_save_is_ours(args.save, args.load, args.overwrite_save)
        except TrainingError as err:
            if lock:
                lock.release()
                lock = None
            error = str(err)
    shared = [error]
    torch.distributed.broadcast_object_list(shared, src=0)
    if shared[0]:
        raise TrainingError(shared[0])
    return lock
