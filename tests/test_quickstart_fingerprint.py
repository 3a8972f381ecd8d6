"""The quickstart is bit-reproducible: two short runs in two folders give the same losses, checkpoints (every
tensor, optimizer and RNG states included) and exported weights (tests/quickstart_fingerprint.py)."""

import pytest

from quickstart_fingerprint import fingerprint, run_quickstart

pytestmark = pytest.mark.integration


def test_two_runs_in_two_folders_are_bit_identical(tmp_path):
    prints = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        out = run_quickstart(tmp_path / name, 12, "--save-interval", "6")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        prints.append(fingerprint(tmp_path / name / "qs"))
    first, second = prints
    # what is compared: the loss of each step, both checkpoints, the export
    assert sum(key.startswith("curve/lm loss/") for key in first) == 12
    assert {key.split("/")[1] for key in first if key.startswith("checkpoint/")} == {"iter_0000006", "iter_0000012"}
    assert "export/decoder.weight" in first
    differ = sorted(key for key in first.keys() | second.keys() if first.get(key) != second.get(key))
    assert not differ, f"{len(differ)} of {len(first)} items differ between the runs, first: {differ[:10]}"
