"""Atomic creation of a checkpoint directory: everything is written into a temporary sibling (``OUT.tmp-XXXX``),
fsynced, and renamed to ``OUT`` only when complete. Any exception — a bug, a full disk, Ctrl-C — removes the
temporary directory, so a reader never sees a half-written checkpoint under ``OUT``."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from quantkit.checkpoint.shards import current_umask
from quantkit.errors import QuantkitError

MANIFEST_NAME = "quantkit.json"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory so the names created or renamed in it survive a crash (POSIX; a no-op elsewhere)."""
    if os.name == "posix":
        _fsync(path)


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder``, then the folder: the rename that publishes a checkpoint must not
    reach the disk before the data it points to."""
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            _fsync(f)
    fsync_dir(folder)


def check_output(out: Path, force: bool) -> None:
    """Refuse an existing ``out`` without ``force``, and with ``force`` anything but a quantkit checkpoint or an
    empty directory (so a mistyped path never deletes unrelated data); the parent folder must exist."""
    if not out.parent.is_dir():
        raise QuantkitError(f"cannot write '{out}': folder '{out.parent}' does not exist; create it first")
    _check_writable(out)
    if not out.exists() and not out.is_symlink():
        return
    replaceable = out.is_dir() and not out.is_symlink() and ((out / MANIFEST_NAME).is_file()
                                                              or not any(out.iterdir()))
    if not force and replaceable:
        raise QuantkitError(f"output '{out}' already exists; pass --force to replace it or choose another -o")
    if not replaceable:
        raise QuantkitError(f"output '{out}' exists and is not a quantkit checkpoint; --force only replaces "
                            "checkpoints — remove it yourself or choose another -o")


def _check_writable(out: Path) -> None:
    """Refuse a folder that will not take the checkpoint's temporary directory, before any quantization work: a probe
    directory is created and removed, since permission bits cannot tell (root ignores them; read-only mounts)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f"{out.name}.probe-", dir=out.parent))
    except OSError as e:
        raise _disk_error(out, e) from None


def _disk_error(out: Path, e: OSError) -> QuantkitError:
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    why = "the disk is full" if full else (e.strerror or str(e))
    fix = "free space or choose another -o" if full else "choose a folder you can write to with -o"
    return QuantkitError(f"cannot write checkpoint '{out}': {why}; nothing was written ({fix})")


@contextlib.contextmanager
def atomic_directory(out: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``out``; on normal exit it replaces ``out`` (an existing one
    needs ``force``: it is renamed aside, the new one renamed in, then the old one deleted). On any exception the
    temporary directory is removed and the exception re-raised (an OSError as a one-line QuantkitError)."""
    out = Path(out).absolute()
    check_output(out, force)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    except OSError as e:
        raise _disk_error(out, e) from None
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; a checkpoint is shared like any save_pretrained dir
    try:
        yield tmp
        fsync_tree(tmp)
        _replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _disk_error(out, e) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and deleted after the swap."""
    if not out.exists():
        os.rename(tmp, out)
        fsync_dir(out.parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.parent))
    os.rmdir(old)  # only the unique name is wanted; rename needs the target not to exist
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)  # put the previous checkpoint back
        raise
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)
