"""The megatron-core releases this package supports, declared once: what each runs on (CPython, Transformer Engine)
and the torch CI runs it with. megatron_core_compat refuses any other series at import, te_support chooses among
them for a container, and tests/test_releases.py holds setup.py, the Dockerfile, .ci/run and README to this record."""

import dataclasses
from pathlib import Path
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Release:
    """A supported megatron-core release and what it needs."""

    version: str
    python: Tuple[Tuple[int, int], Tuple[int, int]]  # the oldest and newest CPython (major, minor) it runs on
    min_te: str  # base release: the oldest Transformer Engine it was run with, or its declared floor
    ci_torch: str  # the torch release CI runs it with (.ci/run's lanes)
    te_below: Optional[str] = None  # base release it declares TE must stay below, where it declares one

    @property
    def series(self) -> str:
        """"0.19" for 0.19.2: megatron_core_compat accepts any patch release of a supported series."""
        return ".".join(self.version.split(".")[:2])

    @property
    def te_api(self) -> Path:
        """The shipped list of the Transformer Engine names this release and the project's layers use (te_support
        checks a container's TE against it; `python -m megatron_neobert.install.te_support --write` regenerates
        it)."""
        return Path(__file__).parents[1] / "assets" / f"te_api_megatron_core_{self.version}.json"


# Newest first: te_support's "auto" takes the first that fits. 0.16.1's TE range is its `dev` extra's
# `>=2.9.0a0,<2.12.0`; 0.19.2 declares none, and 2.17.1 is the oldest TE it was run with (NGC 26.06, the GPU host).
# 0.17 on need CPython 3.12; 0.17 and 0.18 were not reviewed.
RELEASES = (
    Release("0.19.2", python=((3, 12), (3, 12)), min_te="2.17", ci_torch="2.15.0"),
    Release("0.16.1", python=((3, 10), (3, 12)), min_te="2.9", ci_torch="2.13.0", te_below="2.12"),
)
