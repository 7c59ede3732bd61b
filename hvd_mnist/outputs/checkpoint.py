"""Checkpoints of model, optimizer, epoch and the run they belong to, written by rank 0 only.

tf.train.CheckpointManager writes a checkpoint's files first and only then
rewrites the small `checkpoint` state file (atomically) that names the latest
one, so a crash mid-save leaves the previous checkpoint as the latest; a save
that fails (disk full, permissions) removes what it half wrote and says so.
Each checkpoint also holds its run's record (run_identity), read and compared
before anything is restored. Other ranks never read checkpoints: rank 0
restores, then broadcasts.

Two kinds, each with its own manager and `checkpoint` state file:
  checkpoints/ckpt-E              after epoch E; the newest --keep_checkpoints kept
  checkpoints/mid_epoch/step-N    after step N of the run, mid-epoch (--checkpoint_every_*,
                                  a SIGTERM): also its position and the epoch's loss so
                                  far; only the newest kept, and removed once its epoch
                                  has its ckpt-E
`--resume` takes whichever of the two latest is further along (position.py), so a
mid-epoch checkpoint left behind by a kill between the two steps is passed over.
"""

import dataclasses
import glob
import os
import shutil

import tensorflow as tf

from hvd_mnist.outputs import position as position_lib, run_identity
from hvd_mnist.errors import UserFacingError, short_reason

# The checkpoint keys of the run record (a tracked string variable named "run"), and of
# the position.
RUN_KEY = "run/.ATTRIBUTES/VARIABLE_VALUE"
EPOCH_KEY = "epoch/.ATTRIBUTES/VARIABLE_VALUE"
STEP_KEY = "step/.ATTRIBUTES/VARIABLE_VALUE"
MID_EPOCH_DIR = "mid_epoch"


@dataclasses.dataclass(frozen=True)
class Restored:
    epoch: int  # whole epochs done; 0 with steps_done 0: nothing was restored
    path: str = ""
    changes: str = ""  # run_identity.check_resume's note on what the resume changes
    steps_done: int = 0  # of epoch `epoch` + 1 (a mid-epoch checkpoint)
    loss_sum: float = 0.0  # of those steps' losses, for the epoch's record

    @property
    def position(self) -> position_lib.Position:
        return position_lib.Position(self.epoch, self.steps_done)


class CheckpointStore:

    def __init__(self, model_dir: str, model, optimizer, max_to_keep: int, run: dict):
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_sum")
        self._run = run
        state = dict(model=model, optimizer=optimizer, epoch=self.epoch,
                     run=tf.Variable(run_identity.to_json(run), trainable=False, name="run"))
        self._checkpoint = tf.train.Checkpoint(**state)  # as epoch checkpoints always were
        self._mid_epoch_checkpoint = tf.train.Checkpoint(**state, step=self.step,
                                                         loss_sum=self.loss_sum)
        self.directory = os.path.join(model_dir, "checkpoints")
        self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory,
                                                   max_to_keep=max_to_keep)
        self._mid_epoch_manager = self._new_mid_epoch_manager()

    def _new_mid_epoch_manager(self):
        return tf.train.CheckpointManager(
            self._mid_epoch_checkpoint, os.path.join(self.directory, MID_EPOCH_DIR),
            max_to_keep=1, checkpoint_name="step")

    @property
    def latest(self):
        return self._manager.latest_checkpoint

    def save(self, epoch: int) -> str:
        """Writes checkpoint `epoch`; a failed write leaves the previous one the latest.
        The epoch's mid-epoch checkpoint, now behind it, is removed after."""
        self.epoch.assign(epoch)
        path = self._save(self._manager, epoch, f"ckpt-{epoch}")
        if self._mid_epoch_manager.checkpoints:
            # The state file first: a kill now leaves files no state file names. Best
            # effort: one left behind is passed over by --resume, being behind ckpt-E.
            remove_partial_save(os.path.join(self._mid_epoch_manager.directory, "checkpoint"))
            for prefix in self._mid_epoch_manager.checkpoints:
                remove_partial_save(prefix)
            self._mid_epoch_manager = self._new_mid_epoch_manager()  # it remembers them
        return path

    def save_mid_epoch(self, position: position_lib.Position, steps_per_epoch: int,
                       loss_sum: float) -> str:
        """Writes mid_epoch/step-N at `position`; the previous one is removed only after."""
        self.epoch.assign(position.epochs_done)
        self.step.assign(position.steps_done)
        self.loss_sum.assign(loss_sum)
        number = position.run_steps(steps_per_epoch)
        return self._save(self._mid_epoch_manager, number,
                          os.path.join(MID_EPOCH_DIR, f"step-{number}"))

    def _save(self, manager, number: int, name: str) -> str:
        try:
            return manager.save(checkpoint_number=number)
        except (tf.errors.OpError, OSError) as e:
            prefix = os.path.join(self.directory, name)
            if manager.latest_checkpoint != prefix:
                remove_partial_save(prefix)
            previous = self._latest()[0]
            reason = e.strerror if isinstance(e, OSError) else short_reason(e)
            kept = f"the latest checkpoint is still {previous}" if previous else "none was kept"
            raise UserFacingError(
                f"cannot write checkpoint {prefix} ({failure_reason(reason)}); {kept}: free "
                "space or fix the directory, then continue with --resume") from None

    def _latest(self) -> tuple[str | None, position_lib.Position]:
        """The path and position of the checkpoint furthest along, of either kind."""
        best = (None, position_lib.Position())
        for manager in (self._manager, self._mid_epoch_manager):
            path = manager.latest_checkpoint
            if path is None:
                check_state_file(manager.directory)
                continue
            position = self._saved_position(path)
            if best[0] is None or position > best[1]:
                best = (path, position)
        return best

    def restore_latest(self) -> Restored:
        """Restores the latest checkpoint if it belongs to this run; Restored(0) if there is none.

        Model and optimizer variables must already exist, so every saved value
        is checked against a live variable and a mismatch is an error, not a
        silent fresh start.
        """
        path, position = self._latest()
        if path is None:
            return Restored(0)
        saved = self._saved_run(path)
        changes = run_identity.check_resume(saved, self._run, path)
        if position.mid_epoch:
            run_identity.check_mid_epoch_resume(saved, self._run, path)
        checkpoint = self._mid_epoch_checkpoint if position.mid_epoch else self._checkpoint
        try:
            checkpoint.restore(path).assert_existing_objects_matched()
        # IndexError: what TF's reader raises on a truncated .data file.
        except (tf.errors.OpError, AssertionError, ValueError, IndexError) as e:
            raise damaged(path, e) from None
        return Restored(int(self.epoch.numpy()), path, changes, position.steps_done,
                        float(self.loss_sum.numpy()) if position.mid_epoch else 0.0)

    def _saved_position(self, path: str) -> position_lib.Position:
        try:
            reader = tf.train.load_checkpoint(path)
            step = int(reader.get_tensor(STEP_KEY)) if reader.has_tensor(STEP_KEY) else 0
            return position_lib.Position(int(reader.get_tensor(EPOCH_KEY)), step)
        except (tf.errors.OpError, ValueError, IndexError) as e:
            raise damaged(path, e) from None

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


def check_state_file(directory: str) -> None:
    state_file = os.path.join(directory, "checkpoint")
    if os.path.exists(state_file):
        # TF reads an unparsable state file as "no checkpoint"; here that
        # would quietly throw the run's progress away.
        raise UserFacingError(f"{state_file} is damaged and names no checkpoint; "
                              "repair or delete it, or use another --model_dir")


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
    for path in glob.glob(prefix) + glob.glob(prefix + "_temp*") + glob.glob(prefix + ".*"):
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
