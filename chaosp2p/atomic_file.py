"""Writing output files so that a link planted at their temporary path is refused, never followed.

Theory of operation
-------------------
Every file chaosp2p writes for the user (a pulled checkpoint, a pull's resume record, a ready file)
is written next to its final name first (``NAME.partial`` or ``NAME.tmp``) and renamed over it, so
a reader never sees half a file. The temporary name is predictable, and the directory may be
shared (``/tmp``): another local user who plants a symbolic link there would otherwise make us
truncate and overwrite whatever the link points to, with our permissions.

So the temporary file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: the kernel refuses to
create it through a link or over anything that exists. A leftover regular file (an interrupted
earlier write) is unlinked -- which removes that name only, never what a link points to -- and
creation is tried once more; a symbolic link or anything else is refused with a
:class:`~chaosp2p.errors.ConfigError` naming the path. The data is flushed and fsynced, then
``os.replace`` renames it over the final name atomically (a link at the final name is replaced, not
followed), and the directory is fsynced so the rename survives a crash. On any error the temporary
file is removed.

:func:`open_existing_regular` is the same rule for a file that is reopened to be written in place
(a pull's staging file when it resumes): no link is followed and only a plain file with one name
is accepted.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from chaosp2p.errors import ConfigError

_CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_REOPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def create_exclusive(path: str | os.PathLike[str], *, mode: int = 0o644, read: bool = False) -> int:
    """A new file at ``path`` (a file descriptor, write-only unless ``read``); never through a
    link, never over another file.

    A leftover regular file at ``path`` is removed first (its name only); a symbolic link or
    anything else there is refused with :class:`ConfigError`.
    """
    flags = _CREATE_FLAGS | (os.O_RDWR if read else os.O_WRONLY)
    target = Path(path)
    try:
        return os.open(target, flags, mode)
    except FileExistsError:
        pass
    try:
        found = os.lstat(target)
    except FileNotFoundError:  # removed meanwhile: try once more below
        found = None
    if found is not None:
        if stat.S_ISLNK(found.st_mode):
            raise ConfigError(f"{target} is a symbolic link: refusing to write through it (remove it)")
        if not stat.S_ISREG(found.st_mode):
            raise ConfigError(f"{target} exists and is not a regular file: refusing to overwrite it")
        try:
            os.unlink(target)  # a leftover of an interrupted write; unlinking never touches a link's target
        except OSError as exc:
            raise ConfigError(f"cannot remove the leftover {target}: {exc}") from None
    try:
        return os.open(target, flags, mode)
    except FileExistsError:  # someone raced us to the name: do not fight over it
        raise ConfigError(f"{target} appeared while it was being created: refusing to write it") from None


def open_existing_regular(path: str | os.PathLike[str]) -> int | None:
    """``path`` opened read-write if it is a plain file with one name; None if it does not exist.

    A symbolic link (refused by ``O_NOFOLLOW``), a hard-linked file or anything else is refused with
    :class:`ConfigError`: writing in place into it would change a file that is not ours alone.
    """
    target = Path(path)
    try:
        fd = os.open(target, _REOPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(target):
            raise ConfigError(f"{target} is a symbolic link: refusing to write through it (remove it)") from None
        raise ConfigError(f"cannot open {target}: {exc}") from None
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(fd)
        raise ConfigError(f"{target} is not a plain file with a single name: refusing to write into it")
    return fd


def write_atomically(
    path: str | os.PathLike[str], write: Callable[[BinaryIO], None], *, suffix: str = ".partial", mode: int = 0o644
) -> None:
    """Write ``path`` through ``PATH + suffix`` (see the module docstring): ``write`` fills the file."""
    final = Path(path)
    temporary = final.with_name(final.name + suffix)
    fd = create_exclusive(temporary, mode=mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(final.parent)


def write_bytes_atomically(
    path: str | os.PathLike[str], data: bytes, *, suffix: str = ".partial", mode: int = 0o644
) -> None:
    """:func:`write_atomically` with ``data`` as the whole content."""

    def write(handle: BinaryIO) -> None:
        handle.write(data)

    write_atomically(path, write, suffix=suffix, mode=mode)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: some file systems cannot)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
