"""Atomic creation of a checkpoint directory: everything is written into a temporary sibling (``OUT.tmp-XXXX``),
fsynced, and renamed to ``OUT`` only when complete. Any exception — a bug, a full disk, Ctrl-C — removes the
temporary directory, so a reader never sees a half-written checkpoint under ``OUT``.

A writer that is killed outright (SIGKILL, the OOM killer, a power cut) cannot clean up: its temporary directory
holds a marker naming the writing process, and later writes to the same ``OUT`` remove such directories once that
process is gone (:func:`remove_stale_temps`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from quantkit.checkpoint.shards import current_umask
from quantkit.errors import QuantkitError

MANIFEST_NAME = "quantkit.json"
WRITER_MARKER = ".quantkit-writer.json"  # inside OUT.tmp-XXXX while it is written; removed before the rename
STALE_AFTER_S = 24 * 3600  # a temporary directory whose writer cannot be checked is stale after a day untouched
_FULL = (errno.ENOSPC, errno.EDQUOT)
_OS_ERROR = re.compile(r"os error (\d+)")


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


def human_bytes(n: int) -> str:
    """``n`` bytes in decimal units, as --max-shard-size takes them (e.g. '15.2 MB')."""
    for unit, size in (("TB", 10 ** 12), ("GB", 10 ** 9), ("MB", 10 ** 6), ("kB", 10 ** 3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def free_bytes(folder: Path) -> int | None:
    """Bytes a non-root writer may still use on the file system of ``folder`` (None when it cannot be asked)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _no_space(out: Path, needed: int | None, at_least: bool = False) -> QuantkitError:
    free = free_bytes(out.parent)
    known = []
    if needed:
        known.append(f"the checkpoint needs {'at least' if at_least else 'about'} {human_bytes(needed)}")
    if free is not None:
        known.append(f"{human_bytes(free)} free in '{out.parent}'")
    detail = f" ({', '.join(known)})" if known else ""
    return QuantkitError(f"cannot write checkpoint '{out}': no space left on the device{detail}; nothing was "
                         "written (free space there or choose another -o)")


def _disk_error(out: Path, e: OSError, needed: int | None = None) -> QuantkitError:
    if e.errno in _FULL:
        return _no_space(out, needed)
    why = e.strerror or str(e)
    return QuantkitError(f"cannot write checkpoint '{out}': {why}; nothing was written (choose a folder you can "
                         "write to with -o)")


def os_error_of(e: BaseException) -> OSError | None:
    """The OSError behind an exception raised by a Rust extension (safetensors, tokenizers), which reports an I/O
    failure as its own exception type with "(os error N)" in the message; None when the message names none."""
    if isinstance(e, OSError):
        return e
    m = _OS_ERROR.search(str(e))
    if m is None:
        return None
    code = int(m.group(1))
    return OSError(code, os.strerror(code))


def check_free_space(out: Path, needed: int, at_least: bool = False) -> None:
    """Refuse to write ``needed`` bytes (``at_least``: a lower bound) next to ``out`` when its file system has less
    free space."""
    free = free_bytes(out.parent)
    if free is not None and free < needed:
        raise _no_space(out, needed, at_least)


# ----------------------------------------------------------------------------------------- stale temporaries


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux /proc), which tells a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]  # field 22, counted after the parenthesised command name


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _writer_identity() -> dict:
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(), "pid_namespace": _pid_namespace(),
            "start": _proc_start(pid), "created": time.time()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def _last_change(folder: Path) -> float:
    times = [folder.lstat().st_mtime]
    for child in folder.iterdir():
        with contextlib.suppress(OSError):
            times.append(child.lstat().st_mtime)
    return max(times)


def writer_gone(folder: Path, now: float | None = None) -> bool:
    """Whether the temporary directory ``folder`` was left behind by a writer that no longer runs.

    Its marker names the writing process: on this machine (same host, boot and PID namespace) the directory is
    stale when that process is gone (a PID since reused by another process has another start time); after a
    reboot it is stale. A directory whose writer cannot be checked (no marker yet or any more, another host or
    container) is stale only when nothing in it changed for :data:`STALE_AFTER_S`."""
    now = time.time() if now is None else now
    try:
        marker = json.loads((folder / WRITER_MARKER).read_text(encoding="utf-8"))
        pid = int(marker["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        marker = None
    if marker is not None and marker.get("host") == socket.gethostname():
        boot = _boot_id()
        if boot is not None and marker.get("boot_id") not in (None, boot):
            return True
        if marker.get("pid_namespace") == _pid_namespace():
            if not _pid_alive(pid):
                return True
            start = marker.get("start")
            return start is not None and _proc_start(pid) not in (None, start)
    try:
        return now - _last_change(folder) > STALE_AFTER_S
    except OSError:
        return False  # gone already, or unreadable: leave it


def _temp_siblings(out: Path) -> list[Path]:
    pattern = re.compile(re.escape(out.name) + r"\.tmp-[A-Za-z0-9_]{8}")
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    return [out.parent / n for n in sorted(names) if pattern.fullmatch(n)]


def remove_stale_temps(out: str | os.PathLike) -> list[Path]:
    """Remove the ``OUT.tmp-XXXX`` directories that killed writers of ``out`` left behind (see
    :func:`writer_gone`); returns the ones removed. Those of a live writer — another pack to the same ``OUT`` —
    are kept, and so is anything that is not a plain directory."""
    out = Path(out).absolute()
    removed = []
    for tmp in _temp_siblings(out):
        if tmp.is_symlink() or not tmp.is_dir() or not writer_gone(tmp):
            continue
        shutil.rmtree(tmp, ignore_errors=True)  # two cleaners racing over one dead directory both succeed
        if not tmp.exists():
            removed.append(tmp)
    return removed


@contextlib.contextmanager
def atomic_directory(out: str | os.PathLike, force: bool = False, needed: int | None = None) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``out``; on normal exit it replaces ``out`` (an existing one
    needs ``force``: it is renamed aside, the new one renamed in, then the old one deleted). On any exception the
    temporary directory is removed and the exception re-raised (an I/O error as a one-line QuantkitError; a full
    disk names ``needed``, the bytes to write, when given). Stale temporary directories of ``out`` are removed
    first; then, with ``needed``, too little free space is refused before anything is written. The new directory
    carries a marker naming this process until it is renamed."""
    out = Path(out).absolute()
    check_output(out, force)
    remove_stale_temps(out)
    if needed is not None:
        check_free_space(out, needed)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    except OSError as e:
        raise _disk_error(out, e, needed) from None
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; a checkpoint is shared like any HF dir
        (tmp / WRITER_MARKER).write_text(json.dumps(_writer_identity()), encoding="utf-8")
        yield tmp
        (tmp / WRITER_MARKER).unlink()
        fsync_tree(tmp)
        _replace(tmp, out, force)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        io = None if isinstance(e, QuantkitError) else os_error_of(e)
        if io is None:
            raise
        raise _disk_error(out, io, needed) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _appeared(out: Path) -> QuantkitError:
    return QuantkitError(f"output '{out}' was created by another writer while this one wrote; nothing was written "
                         "(pass --force to replace it, or choose another -o)")


def _replace(tmp: Path, out: Path, force: bool) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and deleted after the swap. An ``out``
    that another writer created since :func:`check_output` (two packs racing to one output) is replaced only with
    ``force``: without it this write is the one refused, never the finished checkpoint."""
    if not out.exists() and not out.is_symlink():
        try:
            os.rename(tmp, out)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise _appeared(out) from None
            raise
        fsync_dir(out.parent)
        return
    if not force:
        raise _appeared(out)
    check_output(out, force)  # it must still be a checkpoint (or empty) to be replaced
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
