"""Checkpoints of model, optimizer and epoch, written by rank 0 only.

tf.train.CheckpointManager writes a checkpoint's files first and only then
rewrites the small `checkpoint` state file (atomically) that names the latest
one, so a crash mid-save leaves the previous checkpoint as the latest.
Other ranks never read checkpoints: rank 0 restores, then broadcasts.
"""

import os

import tensorflow as tf

from hvd_mnist.errors import UserFacingError, short_reason


class CheckpointStore:

    def __init__(self, model_dir: str, model, optimizer, max_to_keep: int):
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        self.directory = os.path.join(model_dir, "checkpoints")
        self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory,
                                                   max_to_keep=max_to_keep)

    @property
    def latest(self):
        return self._manager.latest_checkpoint

    def save(self, epoch: int) -> str:
        self.epoch.assign(epoch)
        return self._manager.save(checkpoint_number=epoch)

    def restore_latest(self) -> int:
        """Restores the latest checkpoint; returns its epoch, or 0 if there is none.

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
            return 0
        try:
            self._checkpoint.restore(path).assert_existing_objects_matched()
        # IndexError: what TF's reader raises on a truncated .data file.
        except (tf.errors.OpError, AssertionError, ValueError, IndexError) as e:
            raise UserFacingError(
                f"cannot restore checkpoint {path} ({short_reason(e)}); its .index and "
                ".data files are damaged or from a different model: delete them or use "
                "another --model_dir") from None
        return int(self.epoch.numpy())
