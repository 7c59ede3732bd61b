"""What a run does around its steps, written once for every trainer.

`RunHooks` is called at the same points by the loop (loop.py, which the custom and
the elastic trainer share) and by fit's callbacks (keras_fit.py): an epoch's start
(dropout's streams restarted, the step clock, the progress display), each step's end
(the clock, progress and TensorBoard's step scalars), and the epoch's end (TensorBoard,
the epoch's line, the save, and the decision to stop at --target_accuracy).
"""

import dataclasses

from hvd_mnist import config as config_lib
from hvd_mnist.outputs import progress, records, timing
from hvd_mnist.training import model as model_lib
from hvd_mnist.worker import runtime


@dataclasses.dataclass(frozen=True)
class Epoch:
    """The part of an epoch one call of the loop trains."""
    number: int  # from 1
    steps: int  # the whole epoch's
    first_step: int = 1  # the steps before it are done (a resume, or elastic's restart)
    steps_before: int | None = None  # the run's steps before this epoch; None: (number - 1) x steps
    loss_before: float = 0.0  # the sum of the losses of the steps before first_step
    # Elastic, after a reset: the example the epoch goes on from; dropout's masks are
    # drawn from there (a run without resets is exactly a normal run).
    restart_position: int = 0

    @property
    def run_steps_before(self) -> int:
        return (self.number - 1) * self.steps if self.steps_before is None else self.steps_before


def reached_target(test_accuracy: float, target_accuracy: float) -> bool:
    """--target_accuracy (0: off). Every rank decides alike: the accuracy is reduced over ranks."""
    return bool(target_accuracy) and test_accuracy >= target_accuracy


class RunHooks:
    """The epoch start, step end and epoch end of one run (or elastic start).

    `save(epoch)` writes the epoch's checkpoint (on rank 0, through runtime.on_chief).
    """

    def __init__(self, model, monitor: progress.TrainingMonitor, clock: timing.StepClock, *,
                 seed: int, rank: int, per_rank_batch_size: int, epochs: int,
                 target_accuracy: float, save):
        self.model, self.monitor, self.clock, self.save = model, monitor, clock, save
        self.seed, self.rank, self.per_rank_batch_size = seed, rank, per_rank_batch_size
        self.epochs, self.target_accuracy = epochs, target_accuracy

    def start_epoch(self, epoch: Epoch) -> None:
        done = epoch.first_step - 1
        # Masks differ per rank, as they would on separate machines, and depend only on
        # where the step is, so a resumed run draws the same ones (model.reseed_dropout).
        if epoch.restart_position:
            model_lib.reseed_dropout(self.model, (self.seed, self.rank, epoch.number,
                                                  epoch.restart_position))
        else:
            model_lib.reseed_dropout(self.model, (self.seed, self.rank, epoch.number), done,
                                     self.per_rank_batch_size)
        self.clock.epoch_started()
        self.monitor.start_epoch(epoch.number, steps=epoch.steps, done_steps=done,
                                 steps_before=epoch.run_steps_before)

    def step_done(self, step: int, loss_sum) -> None:
        """`loss_sum()`: the losses of the epoch's steps since start_epoch, summed."""
        self.clock.step_done()
        self.monitor.step_done(step, loss_sum)

    def end_epoch(self, record: dict) -> bool:
        """After the epoch's evaluation (`record`: records.epoch_record); True: stop here."""
        self.monitor.end_epoch(record)
        self.save(record["epoch"])
        runtime.log(records.format_epoch(record, self.epochs))
        if reached_target(record["test_accuracy"], self.target_accuracy):
            runtime.log(f"reached --target_accuracy={self.target_accuracy:g} after epoch "
                        f"{record['epoch']}")
            return True
        return False

    def close(self) -> None:
        self.monitor.close()


def for_run(config: config_lib.TrainConfig, model, optimizer, *, epochs: int,
            steps_per_epoch: int, batching: config_lib.Batching, rank: int, save,
            clock: timing.StepClock | None = None, **monitor_options) -> RunHooks:
    """The run's hooks; `monitor_options`: progress.monitor_for_run's `draw_bar`, `board`."""
    monitor = progress.monitor_for_run(
        progress=config.progress, log_every=config.log_every, model_dir=config.model_dir,
        epochs=epochs, steps_per_epoch=steps_per_epoch,
        images_per_step=batching.global_batch_size,
        learning_rate=lambda: float(optimizer.learning_rate), **monitor_options)
    return RunHooks(model, monitor, clock or timing.StepClock(batching.global_batch_size),
                    seed=config.seed, rank=rank, per_rank_batch_size=batching.per_rank_batch_size,
                    epochs=epochs, target_accuracy=config.target_accuracy, save=save)
