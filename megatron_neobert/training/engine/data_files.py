"""The data files a run reads, by identity, so that it never goes on with other data without saying so.

A checkpoint records each dataset's .bin and .idx (bytes, modification time) and the CRC-32 of the .idx, which
holds every document's length and place in the .bin (train_state["data_files"]). A resume that keeps the saved
sample position (the same data settings) refuses files whose content changed since, as the position would point into
other data, unless --allow-data-change; files only touched (the same sizes and CRC-32, other times) are announced.
During the run the files are compared with their start before each save (a checkpoint whose position belongs to
other data is refused), and `describe_changes` names them when a bus error ends a reader (see
`resilience/guards/bus_errors.py`).
"""

import logging
import os
from typing import Dict, List, Optional

import torch

from megatron_neobert.checkpoint.integrity import shared_crc32
from megatron_neobert.errors import TrainingError

logger = logging.getLogger(__name__)


def _stat(path: str) -> List[int]:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return [-1, 0]
    return [found.st_size, found.st_mtime_ns]


def _describe(path: str, then: List[int], now: List[int]) -> str:
    if now[0] < 0:
        return f"{path} was removed"
    if now[0] != then[0]:
        return f"{path} was rewritten ({then[0]:,} -> {now[0]:,} bytes)"
    return f"{path} was rewritten (the same {now[0]:,} bytes, modified since)"


class DataFiles:
    """The identity of the run's datasets at its start, the same on every rank: {prefix: {"bin": [bytes,
    mtime_ns], "idx": [bytes, mtime_ns], "idx_crc32": ...}}. Rank 0 reads the times; the ranks share the reading of
    the .idx files (`shared_crc32`), which is the corpus's largest start-up read: 20 bytes per document."""

    def __init__(self, prefixes: List[str]):
        shared = [{p: {"bin": _stat(p + ".bin"), "idx": _stat(p + ".idx")} for p in prefixes}
                  if torch.distributed.get_rank() == 0 else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        checksums = shared_crc32([p + ".idx" for p in prefixes])
        self.files: Dict[str, dict] = {p: dict(shared[0][p], idx_crc32=checksums[p + ".idx"]["crc32"])
                                       for p in prefixes}

    def changes(self) -> List[str]:
        """The files whose size or modification time differ from the start, described (stat only: cheap)."""
        found = []
        for prefix, then in self.files.items():
            for ext in ("bin", "idx"):
                now = _stat(f"{prefix}.{ext}")
                if now != then[ext]:
                    found.append(_describe(f"{prefix}.{ext}", then[ext], now))
        return found

    def describe_changes(self) -> str:
        return "; ".join(self.changes()) or "no data file changed since the start"

    def check_unchanged(self, iteration: int) -> None:
        """Collective, before a save: refuse a checkpoint whose data position belongs to files changed since the
        start (rank 0 looks, every rank raises)."""
        shared = [self.changes() if torch.distributed.get_rank() == 0 else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        if shared[0]:
            raise TrainingError(f"the training data changed under the running job: {'; '.join(shared[0])}; the "
                                f"checkpoint of iteration {iteration} was not saved (its data position would point "
                                f"into other data). Restore the files, or resume on the new data with "
                                f"--allow-data-change")

    def check_resume(self, saved: Optional[Dict[str, dict]], checkpoint: str, keeps_position: bool,
                     allow_change: bool) -> None:
        """On every rank alike: refuse (or with `allow_change` announce) a resume at the saved position into data
        whose content changed since `checkpoint` was saved; announce files only touched, or changed data that the
        run reads from its start anyway (other data settings)."""
        if saved is None:  # a checkpoint of an earlier version: nothing to compare
            return
        changed, touched = [], []
        for prefix in sorted(set(saved) & set(self.files)):
            then, now = saved[prefix], self.files[prefix]
            same_content = then["idx_crc32"] == now["idx_crc32"] and (then["bin"][0], then["idx"][0]) == (
                now["bin"][0], now["idx"][0])
            if not same_content:
                changed += [_describe(f"{prefix}.{ext}", then[ext], now[ext]) for ext in ("idx", "bin")
                            if then[ext][0] != now[ext][0] or ext == "idx"]
            elif (then["bin"][1], then["idx"][1]) != (now["bin"][1], now["idx"][1]):
                touched.append(prefix)
        if touched:
            logger.info(f"data files modified since {checkpoint} was saved, with the same sizes and .idx checksum: "
                        f"{', '.join(touched)}")
        if not changed:
            return
        what = f"the data changed since {checkpoint} was saved: {'; '.join(changed)} (other .idx checksum)"
        if keeps_position and not allow_change:
            raise TrainingError(f"{what}; resuming would continue at the checkpoint's sample position in other data. "
                                f"Restore the files, or pass --allow-data-change to go on with the new data from "
                                f"that position")
        going_on = ("going on from the checkpoint's sample position (--allow-data-change)" if keeps_position else
                    "the run reads its data from the start (other data settings)")
        logger.info(f"{what}: {going_on}")
