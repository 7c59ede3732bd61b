"""One run at a time in a model_dir: a lock that dies with the process holding it.

Rank 0 takes an exclusive fcntl lock (POSIX, which NFS's lock manager also serves, so it
holds across the hosts that share the directory) on model_dir/owner.lock before the run
writes anything there, and holds it until the run ends. The kernel (on NFS, the server
once the holder's lease lapses) drops it when the process dies, however it dies, so a
crash never leaves a lock for someone to delete by hand. The file names its holder (host,
pid, start time, job): a second run is refused naming it, and a run that finds the file
of a holder that died (the lock free, the file still there) takes over and says whose.
A run that ends removes the file, so a file left behind always means a run that died.

Elastic jobs: the lock belongs to the job, held by whichever process is rank 0. A reset
can move rank 0 to another process, so every sync's rank 0 takes it (elastic.py); one
held by another process of the same job (an earlier rank 0 still alive) counts as held.

Read-only uses of a model_dir (predict, plot) take no lock.
"""

import atexit
import errno
import fcntl
import json
import os
import socket
import time

from hvd_mnist.errors import UserFacingError
from hvd_mnist.outputs import files

LOCK_FILE = "owner.lock"

# A POSIX lock belongs to the process and is dropped when it closes *any* descriptor of
# the file, so each process opens the file once and keeps it here: path -> descriptor.
_held = {}


def take(model_dir: str, job: str = "") -> str:
    """Makes model_dir and takes its lock for this process, until `release` or exit.

    Returns a line naming the holder that died holding it, or "". UserFacingError, naming
    the holder, when another run holds it; a holder of the same `job` (an elastic job's
    earlier rank 0) counts as this run.
    """
    path = os.path.join(model_dir, LOCK_FILE)
    if path in _held:
        return ""
    try:
        os.makedirs(model_dir, exist_ok=True)
        fd, previous = _lock(path)
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
            raise UserFacingError(
                f"cannot lock {path} ({e.strerror}): its filesystem has no fcntl locks, which "
                "keep a second run out of a model_dir; use another --model_dir") from None
        raise UserFacingError(f"--model_dir={model_dir} is not writable ({e.strerror})") from None
    same_job = bool(job) and previous.get("job") == job
    if fd is None:
        if same_job:
            return ""
        raise UserFacingError(f"--model_dir={model_dir} is in use by another run "
                              f"({describe(previous)}); wait for it to end, or use another "
                              "--model_dir")
    if not _held:
        atexit.register(release_all)  # an error or exit that skips `release`
    _held[path] = fd
    record = {"host": socket.gethostname(), "pid": os.getpid(), "job": job,
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with files.writing(path):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)  # before anything else is written: another host reads it from the server
    if not previous:
        return ""
    if same_job:
        return f"{model_dir}: rank 0 moved here from {describe(previous)}, which is gone"
    return (f"{model_dir} was held by a run that ended without releasing it "
            f"({describe(previous)}); this run takes it over")


def _lock(path: str):
    """(descriptor holding the lock, the previous holder's record) or (None, the holder's
    record) when another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise
            holder = _read(fd)
            os.close(fd)
            return None, holder
        # A holder that was releasing removed the file between our open and our lock: the
        # lock is on a file no one else will look at, so lock the one now at `path`.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd, _read(fd)
        os.close(fd)


def _read(fd: int) -> dict:
    text = os.pread(fd, 4096, 0).decode(errors="replace")
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text[:80]}


def describe(holder: dict) -> str:
    if not holder:
        return "a run that has not yet written its name"
    if "unreadable" in holder:
        return f"{LOCK_FILE} reads {holder['unreadable']!r}"
    return (f"host {holder.get('host')}, pid {holder.get('pid')}, started "
            f"{holder.get('started_utc')}")


def release(model_dir: str) -> None:
    """Gives model_dir up, if this process holds it: the file goes first, then the lock."""
    path = os.path.join(model_dir, LOCK_FILE)
    fd = _held.pop(path, None)
    if fd is None:
        return
    try:
        os.remove(path)  # while still locked, so no one can take a file on its way out
    except OSError:
        pass  # the directory was removed or made read-only: the lock goes anyway
    os.close(fd)


def release_all() -> None:
    for path in list(_held):
        release(os.path.dirname(path))
