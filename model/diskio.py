"""Files written whole or not at all, and read without waiting on what is no file.

- ``atomic_write``: temp file, fsync, rename, fsync of the folder; readers see the old file or
  the new one, never half. A failure (a full or read-only disk, a missing permission, a directory or
  a FIFO at the path) raises ``engine_advisor.model.errors.DiskError`` naming the path the user
  named (never the temp file) and the cause, after the temp file is removed. A new file gets the
  permissions ``open()`` would give it (0666 less the umask); a replaced one keeps its own.
- ``read_regular``: opens non-blocking and checks the kind of file first; a directory or a FIFO
  is named as such, never read or waited on.

Standard library only: the kernel profilers on a bare GPU image use it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from engine_advisor.model.errors import DiskError


def file_kind(mode: int) -> str | None:
    """What a file of this ``st_mode`` is, when it is not a regular file: ``is a directory``,
    ``is not a regular file (a FIFO)``...; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device"}.get(stat.S_IFMT(mode), "a special file")
    return f"is not a regular file ({kind})"


def read_regular(path: Path) -> bytes:
    """The bytes of the regular file at ``path``. Raises the OS's OSError (FileNotFoundError,
    PermissionError ...), or ``DiskError`` (``strerror`` None) saying what the path is when it
    is no regular file. Never blocks on a FIFO: it is opened non-blocking and looked at
    before anything is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise DiskError(errno.EISDIR if kind == "is a directory" else errno.EINVAL, None,
                            str(path), kind)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (Linux ``/proc``), else set-and-reset once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_NEW_FILE_MODE = 0o666 & ~_umask()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half.

    Any failure (a full or read-only disk, a missing permission, a directory or a FIFO at
    ``path``) raises ``DiskError`` naming ``path`` and the cause, after the temp file is
    removed: the old file, if any, is untouched."""
    path = Path(path)
    try:
        old_mode: int | None = path.stat().st_mode
    except OSError:                 # absent (or unreadable: the write below says why)
        old_mode = None
    kind = None if old_mode is None else file_kind(old_mode)
    if kind is not None:
        raise DiskError(errno.EISDIR if kind == "is a directory" else errno.EINVAL, None,
                        str(path), f"{kind}; not replacing it")
    # a replaced file keeps its permissions; a new one gets what open() would give it
    mode = _NEW_FILE_MODE if old_mode is None else stat.S_IMODE(old_mode)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DiskError.of(path, exc, f"cannot create its folder {path.parent}") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise DiskError.of(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)                # mkstemp makes it 0600
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):     # a disk turned read-only keeps it: nothing to do
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise DiskError.of(path, exc) from None
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise DiskError.of(path, exc, f"written, but its folder {path.parent} cannot be "
                                      "synced") from None
