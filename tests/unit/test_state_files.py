"""Output files are written through a temporary name that is never followed if it is a link.

Issue 20, finding 13: ``.partial``/``.tmp`` outputs (a pulled checkpoint, a resume record, the
staging file of a pull, the ready files) were opened following symbolic links, so another local
user who planted a link at the predictable name made us overwrite the file it points to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import numpy as np
import pytest

from chaosp2p.cli.common import announce_ready
from chaosp2p.errors import ConfigError
from chaosp2p.protocols.transfer import ResumeRecord
from chaosp2p.state.buffers import StagingBuffer
from chaosp2p.state.checkpoint_file import read_checkpoint, write_checkpoint
from chaosp2p.state.manifest import FlatState
from chaosp2p.state.resume import save_resume
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.trainers.script import write_ready_file
from chaosp2p.wire.multiaddr import Multiaddr

# The helpers of chaosp2p.atomic_file are imported inside the tests that use them, so the
# regression tests above them also run (and fail) against the code before the fix.
VICTIM_TEXT = b"a file the link points at; it must survive\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(VICTIM_TEXT)
    return victim


def _state() -> FlatState:
    return FlatState({"w": np.arange(6, dtype=np.float32)}, {"w": "float32"})


def _record() -> ResumeRecord:
    return ResumeRecord(run="r", step=3, hash_algorithm="xxh3", digest=b"\1" * 32, chunk_count=9, verified=b"\xff\x01")


WRITERS = {
    # `state pull --out` writes OUT.partial, then renames it
    "checkpoint": ("pulled.npz", ".partial", lambda path: write_checkpoint(path, _state())),
    # a pull's resume record goes through PATH.tmp
    "resume record": ("pull.resume", ".tmp", lambda path: save_resume(path, _record())),
}


@pytest.mark.parametrize("what", sorted(WRITERS))
def test_a_link_planted_at_the_temporary_name_is_refused_not_followed(tmp_path: Path, what: str) -> None:
    """Issue 20, finding 13: a checkpoint's .partial and a resume record's .tmp followed links."""
    name, suffix, write = WRITERS[what]
    victim = _victim(tmp_path)
    (tmp_path / (name + suffix)).symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write(tmp_path / name)
    assert victim.read_bytes() == VICTIM_TEXT
    assert not (tmp_path / name).exists()
    assert (tmp_path / (name + suffix)).is_symlink()  # refused, left for the user to look at


def test_a_link_or_a_hard_link_at_a_pulls_staging_file_is_refused(tmp_path: Path) -> None:
    """Issue 20, finding 13: the staging file next to a resume record is not written through links."""
    info = SnapshotStore().publish("r", 1, _state())
    victim = _victim(tmp_path)
    staging = tmp_path / "pull.resume.data"
    staging.symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        StagingBuffer(info.manifest, path=staging)
    staging.unlink()
    victim.write_bytes(bytes(info.manifest.total_bytes))  # the right size: it would be reused in place
    os.link(victim, staging)
    with pytest.raises(ConfigError, match="single name"):
        StagingBuffer(info.manifest, path=staging)
    assert victim.read_bytes() == bytes(info.manifest.total_bytes)


def test_ready_files_are_not_written_through_a_planted_link(tmp_path: Path) -> None:
    """Issue 20, finding 13: ``--ready-file`` (CLI: F.partial, example scripts: F.tmp)."""
    victim = _victim(tmp_path)
    cli_ready = tmp_path / "ready.json"
    (tmp_path / "ready.json.partial").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        anyio.run(announce_ready, "peer", [Multiaddr.parse("/ip4/127.0.0.1/tcp/1")], str(cli_ready))
    script_ready = tmp_path / "script-ready.json"
    (tmp_path / "script-ready.json.tmp").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_ready_file(script_ready, "peer", [])
    assert victim.read_bytes() == VICTIM_TEXT
    assert not cli_ready.exists() and not script_ready.exists()


def test_a_leftover_partial_file_is_replaced_and_a_link_at_the_final_name_is_replaced_not_followed(
    tmp_path: Path,
) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "state.npz"
    (tmp_path / "state.npz.partial").write_bytes(b"left by an interrupted pull")
    out.symlink_to(victim)  # the final rename replaces the link itself
    write_checkpoint(out, _state())
    assert not out.is_symlink() and victim.read_bytes() == VICTIM_TEXT
    np.testing.assert_array_equal(read_checkpoint(out).arrays["w"], np.arange(6, dtype=np.float32))
    assert not (tmp_path / "state.npz.partial").exists()


def test_the_temporary_file_is_removed_when_writing_fails(tmp_path: Path) -> None:
    out = tmp_path / "out.json"

    from chaosp2p.atomic_file import write_atomically, write_bytes_atomically

    def fail(handle: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(out, fail)
    assert list(tmp_path.iterdir()) == []
    write_bytes_atomically(out, json.dumps({"ok": 1}).encode())
    assert json.loads(out.read_text()) == {"ok": 1}


def test_anything_but_a_regular_file_at_the_temporary_name_is_refused(tmp_path: Path) -> None:
    from chaosp2p.atomic_file import create_exclusive

    (tmp_path / "x.partial").mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        create_exclusive(tmp_path / "x.partial")
