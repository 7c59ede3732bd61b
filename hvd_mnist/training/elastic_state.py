"""What an elastic job keeps across resets: every variable and the run's progress.

`TrainingState` is committed to host memory every --commit_every steps and at
every epoch end; on a reset the survivors restore the last commit, and `sync`
hands rank 0's state to every worker, joining ones included.
"""

import horovod.tensorflow as hvd

from hvd_mnist.worker import runtime


# Horovod: an ObjectState is what hvd.elastic.run commits, restores on a reset and syncs.
class TrainingState(hvd.elastic.ObjectState):
    """What a reset restores and a (re)start broadcasts: the variables, and progress as
    plain Python values (immutable ones: ObjectState keeps references, not copies)."""

    def __init__(self, variables, chief_prepare, **progress):
        self._variables = variables
        # On rank 0 before the broadcast of each sync: fn(first_sync) -> progress updates.
        self._chief_prepare = chief_prepare
        self._synced_before = False
        self._save_variables()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **progress)

    @property
    def variables(self):
        return self._variables

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for variable, value in zip(self._variables, self._values):
            variable.assign(value)
        super().restore()

    def sync(self):
        # The run's one broadcast of rank 0's state, at its start and after every reset
        # (as loop.py broadcasts before step 1): fresh weights, a --resume
        # restore and a joining worker's start all take this path, before any step.
        first_sync = not self._synced_before
        for name, value in runtime.on_chief(lambda: self._chief_prepare(first_sync)).items():
            setattr(self, name, value)
        # Horovod: rank 0's weights and optimizer state on every worker, joining ones too.
        hvd.broadcast_variables(self._variables, root_rank=0)
        hvd.elastic.ObjectState.save(self)  # rank 0's progress, with its updates, is broadcast
        super().sync()
        self._save_variables()
        self._synced_before = True

    def _save_variables(self):
        # Copies: an array viewing a variable's buffer could change with the next step.
        self._values = [variable.numpy().copy() for variable in self._variables]
