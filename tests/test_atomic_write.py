"""The one atomic writer: a reader sees the old content or the new, never a part; a failure leaves the old content
and no temporary; the new content and its name are flushed to disk (the file, then its folder)."""

import os

import pytest

from megatron_neobert.atomic_write import atomic_file, atomic_path, write_json_atomic, write_text_atomic


def leftovers(folder):
    return sorted(p.name for p in folder.rglob("*") if ".tmp-" in p.name)


@pytest.fixture
def synced(monkeypatch):
    """The paths os.fsync is called on, in order."""
    calls, fsync = [], os.fsync

    def recording(fd):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fsync(fd)
    monkeypatch.setattr(os, "fsync", recording)
    return calls


def test_a_file_is_replaced_whole_and_durably(tmp_path, synced):
    target = tmp_path / "sub" / "result.json"
    write_json_atomic(target, {"a": 1})
    assert target.read_text() == '{\n  "a": 1\n}\n' and leftovers(tmp_path) == []
    # The content under its temporary name, then the folder holding the new name.
    assert synced[-1] == str(target.parent) and ".tmp-" in os.path.basename(synced[-2])
    write_text_atomic(target, "second")
    assert target.read_text() == "second"


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "log.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk"):
        with atomic_file(target) as f:
            f.write("half of the new")
            raise RuntimeError("disk full")
    assert target.read_text() == "old" and leftovers(tmp_path) == []


def test_a_folder_written_by_another_library_replaces_the_old_one(tmp_path, synced):
    target = tmp_path / "export"
    (target / "old_only").mkdir(parents=True)
    with atomic_path(target) as tmp:
        (tmp / "weights").mkdir(parents=True)
        (tmp / "weights" / "model.bin").write_bytes(b"new")
        assert not (target / "weights").exists()  # nothing shows before the block ends
    assert sorted(p.name for p in target.iterdir()) == ["weights"] and leftovers(tmp_path) == []
    assert str(target.parent) in synced  # the rename, made durable
    assert any(path.endswith("model.bin") for path in synced)  # the folder's files, before it


def test_a_failed_folder_leaves_the_old_one(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "config.json").write_text("{}")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "config.json").write_text('{"new": true}')
            raise KeyboardInterrupt
    assert (target / "config.json").read_text() == "{}" and leftovers(tmp_path) == []


def test_the_temporary_keeps_the_suffix_writers_read_the_format_from(tmp_path):
    numpy = pytest.importorskip("numpy")
    target = tmp_path / "ids.npy"
    with atomic_path(target) as tmp:
        assert tmp.suffix == ".npy" and tmp.name.startswith(".ids.tmp-")
        numpy.save(tmp, numpy.arange(3))  # numpy.save adds .npy to any other name
    assert numpy.load(target).tolist() == [0, 1, 2] and leftovers(tmp_path) == []
