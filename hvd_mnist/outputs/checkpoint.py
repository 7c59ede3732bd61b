"""Checkpoints of model, optimizer, epoch and the run they belong to, written by rank 0 only.

tf.train.CheckpointManager writes a checkpoint's files first and only then
rewrites the small `checkpoint` state file (atomically) that names the latest
one, so a crash mid-save leaves the previous checkpoint as the latest; a save
that fails (disk full, permissions) removes what it half wrote and says so.
Each checkpoint also holds its run's record (run_identity), read and compared
before anything is restored. Other ranks never read checkpoints: rank 0
restores, then broadcasts.
"""

import dataclasses
import glob
import os
import shutil

import tensorflow as tf

from hvd_mnist.outputs import run_identity
from hvd_mnist.errors import UserFacingError, short_reason

# The checkpoint key of the run record (a tracked string variable named "run").
RUN_KEY = "run/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass(frozen=True)
class Restored:
    epoch: int  # 0: nothing was restored
    path: str = ""
    changes: str = ""  # run_identity.check_resume's note on what the resume changes


class CheckpointStore:

    def __init__(self, model_dir: str, model, optimizer, max_to_keep: int, run: dict):
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self._run = run
        self._checkpoint = tf.train.Checkpoint(
            model=model, optimizer=optimizer, epoch=self.epoch,
            run=tf.Variable(run_identity.to_json(run), trainable=False, name="run"))
        self.directory = os.path.join(model_dir, "checkpoints")
        self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory,
                                                   max_to_keep=max_to_keep)

    @property
    def latest(self):
        return self._manager.latest_checkpoint

    def save(self, epoch: int) -> str:
        """Writes checkpoint `epoch`; a failed write leaves the previous one the latest."""
        self.epoch.assign(epoch)
        previous = self.latest
        try:
            return self._manager.save(checkpoint_number=epoch)
        except (tf.errors.OpError, OSError) as e:
            prefix = os.path.join(self.directory, f"ckpt-{epoch}")
            if self.latest != prefix:
                remove_partial_save(prefix)
            reason = e.strerror if isinstance(e, OSError) else short_reason(e)
            kept = f"the latest checkpoint is still {previous}" if previous else "none was kept"
            raise UserFacingError(
                f"cannot write checkpoint {prefix} ({failure_reason(reason)}); {kept}: free "
                "space or fix the directory, then continue with --resume") from None

    def restore_latest(self) -> Restored:
        """Restores the latest checkpoint if it belongs to this run; Restored(0) if there is none.

        Model and optimizer variables must already exist, so every saved value
        is checked against a live variable and a mismatch is an error, not a
        silent fresh start.
        """
        path = self.latest
        if path is None:
            state_file = os.path.join(self.directory, "checkpoint")
            if os.path.exists(state_file):
                # TF reads an unparsable state file as "no checkpoint"; here that
                # would quietly throw the run's progress away.
                raise UserFacingError(f"{state_file} is damaged and names no checkpoint; "
                                      "repair or delete it, or use another --model_dir")
            return Restored(0)
        changes = run_identity.check_resume(self._saved_run(path), self._run, path)
        try:
            self._checkpoint.restore(path).assert_existing_objects_matched()
        # IndexError: what TF's reader raises on a truncated .data file.
        except (tf.errors.OpError, AssertionError, ValueError, IndexError) as e:
            raise damaged(path, e) from None
        return Restored(int(self.epoch.numpy()), path, changes)

    def _saved_run(self, path: str) -> dict:
        try:
            reader = tf.train.load_checkpoint(path)
            if not reader.has_tensor(RUN_KEY):
                raise UserFacingError(
                    f"cannot resume from {path}: it records no run settings (written by an "
                    "older hvd_mnist), so it cannot be checked against this run; resume it "
                    "with that version, or start afresh with another --model_dir")
            return run_identity.from_json(reader.get_tensor(RUN_KEY).decode())
        except (tf.errors.OpError, ValueError, IndexError) as e:
            raise damaged(path, e) from None


def damaged(path: str, error: BaseException) -> UserFacingError:
    return UserFacingError(
        f"cannot restore checkpoint {path} ({short_reason(error)}); its .index and .data "
        "files are damaged or from a different model: delete them or use another --model_dir")


def failure_reason(reason: str) -> str:
    """The OS's words for a failed write (TF appends them after the file's name)."""
    for known in ("No space left on device", "Disk quota exceeded", "Permission denied",
                  "Read-only file system", "Operation not permitted", "No such file or directory"):
        if known.lower() in reason.lower():
            return known
    return reason


def remove_partial_save(prefix: str) -> None:
    """Removes what a failed save of `prefix` wrote; best effort, the error is reported anyway."""
    for path in glob.glob(prefix + "_temp*") + glob.glob(prefix + ".*"):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                pass
    for path in glob.glob(os.path.join(os.path.dirname(prefix), "checkpoint.tmp*")):
        try:
            os.remove(path)
        except OSError:
            pass
