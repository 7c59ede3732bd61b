"""Elastic training (--elastic): the custom loop under hvd.elastic.run, workers may leave and join.

The state (elastic_state.py) holds every model and optimizer variable and the
run's progress (epoch, and position: how many examples of the epoch's
permutation are done). On a reset Horovod re-initialises with the new set of
workers; the survivors have restored the last commit, the state's sync hands
rank 0's state to everyone (joining workers included), and `_train` starts
again from there: the job re-sized for the new workers (job.resize: batch and
learning rate as at start), and the rest of the epoch, examples
[position, end), split over them (data/resharding.py). The steps, evaluation and
everything at an epoch's end are the custom trainer's (loop.Loop and its hooks); elastic
adds the commits (`Commits`, the loop's control here) and the restarts around them.
"""

import dataclasses
import time
import uuid

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist import config as config_lib
from hvd_mnist.data import resharding, splits
from hvd_mnist.outputs import (checkpoint, ownership, records, run_identity, tensorboard_log,
                               timing)
from hvd_mnist.training import (hooks as hooks_lib, job as job_lib, loop, model as model_lib,
                                preemption, step as step_lib)
from hvd_mnist.training.elastic_state import TrainingState
from hvd_mnist.worker import keras_compat, runtime


@dataclasses.dataclass
class _Run:
    """What every (re)start of `_train` uses and no reset changes."""
    config: config_lib.TrainConfig
    job: job_lib.Job  # as first started; `_train` re-sizes it at every start
    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    train_step: object
    eval_step: object
    clock: timing.StepClock
    board: tensorboard_log.TensorBoardLog
    wall_start: float
    # This process's commits and the seconds they took (summary.json: what elastic costs).
    commits: int = 0
    commit_seconds: float = 0.0


def train_and_evaluate(config: config_lib.TrainConfig) -> dict:
    """Trains with the custom loop under hvd.elastic.run; returns the run's summary.

    config.py has refused what elastic training cannot do (its `--elastic` rules).
    """
    wall_start = time.perf_counter()
    job = job_lib.start_process(config)
    tf.keras.utils.set_random_seed(config.seed)
    model = model_lib.build_model(dropout=config.dropout, precision=config.precision)
    optimizer = job_lib.scheduled_optimizer(config, job)
    # Before the state captures the optimizer's variables: a state made before the
    # slots exist leaves them out, and a joining worker would later create them
    # alone (Horovod's tracker: new workers hang).
    optimizer.build(model.trainable_variables)
    train_step = step_lib.train_step_for(
        model, optimizer, backward_passes_per_step=config.backward_passes_per_step,
        fp16_allreduce=config.fp16_allreduce)
    run = _Run(config, job, model, optimizer, train_step,
               step_lib.make_eval_step(model), timing.StepClock(job.batching.global_batch_size),
               tensorboard_log.TensorBoardLog(config.model_dir), wall_start)
    state = TrainingState(
        keras_compat.state_variables(model, optimizer),
        lambda first: _prepare_on_chief(run, state.owner_job, first),
        epoch=1, first_epoch=1, position=0, epoch_examples=0, loss_sum=0.0,
        steps_in_epoch=0, epoch_seconds=0.0, train_steps=0, images_trained=0, starts=0,
        finished=False, history=(), owner_job="")
    # Horovod: on a reset, restore the last commit, re-form with the workers left, sync, rerun.
    return hvd.elastic.run(_train)(state, run)


def _store(run: _Run, job: job_lib.Job) -> checkpoint.CheckpointStore:
    record = run_identity.of_run(run.config, job.batching, job.topology.size,
                                 job.steps_per_epoch, run.model, run.optimizer)
    return checkpoint.CheckpointStore(run.config.model_dir, run.model, run.optimizer,
                                      run.config.keep_checkpoints, record)


def _prepare_on_chief(run: _Run, owner_job: str, first_sync: bool) -> dict:
    """Rank 0, before its state is broadcast: model_dir held by this job (ownership.py),
    and at the job's start, --resume."""
    config = run.config
    # At every sync, not only the first: a reset may have made another process rank 0,
    # and the earlier one may be gone with its lock. The job's name travels in the state.
    owner_job = owner_job or uuid.uuid4().hex
    taken_over = ownership.take(config.model_dir, job=owner_job)
    if taken_over:
        runtime.log(taken_over)
    if not first_sync:
        return {"owner_job": owner_job}
    store = _store(run, run.job)
    restored = store.restore_latest() if config.resume else checkpoint.Restored(0)
    records.record_start(config, hvd.size(),
                         resumed_after_epoch=restored.epoch if config.resume else None)
    loop.log_resume(config.resume, restored, store)
    progress = {"epoch": restored.epoch + 1, "first_epoch": restored.epoch + 1,
                "owner_job": owner_job}
    if restored.steps_done:  # a mid-epoch checkpoint of the custom loop: its rest of the epoch
        global_batch_size = run.job.batching.global_batch_size
        progress.update(position=restored.steps_done * global_batch_size,
                        epoch_examples=run.job.steps_per_epoch * global_batch_size,
                        steps_in_epoch=restored.steps_done, loss_sum=restored.loss_sum)
    return progress


def _train(state: TrainingState, run: _Run) -> dict:
    """One (re)start: from the synced state to the end of the run, at the current size."""
    config = run.config
    job = job_lib.resize(config, run.job, runtime.topology())
    topology, batching = job.topology, job.batching
    # The rate scales with the workers as at start (a constant rate: config.py's --elastic rules).
    run.optimizer.learning_rate = batching.learning_rate
    run.clock.images_per_step = batching.global_batch_size
    store = _store(run, job)  # in whichever process is rank 0 now
    hooks = hooks_lib.for_run(config, run.model, run.optimizer, epochs=config.epochs,
                              steps_per_epoch=job.steps_per_epoch, batching=batching,
                              rank=topology.rank, clock=run.clock, board=run.board,
                              # Horovod: rank 0 alone writes checkpoints.
                              save=lambda epoch: runtime.on_chief(lambda: store.save(epoch)))
    run_loop = loop.Loop(run.train_step, run.eval_step,
                         job.source.eval_batches(batching.per_rank_batch_size), hooks)
    state.starts += 1
    state.save()  # so a later restore cannot bring back an earlier start's number
    runtime.log(f"elastic: start {state.starts} on {topology.size} worker(s) at epoch "
                f"{state.epoch}, example {state.position} of {state.epoch_examples or 'its'} "
                f"epoch: {batching.per_rank_batch_size} per worker, {config.optimizer} "
                f"learning rate {batching.learning_rate:g}")

    while state.epoch <= config.epochs and not state.finished:
        _train_rest_of_epoch(state, run, job, run_loop)
        record, state.finished = run_loop.end_epoch(
            state.epoch, state.loss_sum / state.steps_in_epoch,
            train_seconds=state.epoch_seconds, images_trained=state.epoch_examples)
        state.history = state.history + (record,)
        state.epoch, state.position, state.epoch_examples = state.epoch + 1, 0, 0
        state.loss_sum, state.steps_in_epoch, state.epoch_seconds = 0.0, 0, 0.0
        state.commit()

    summary = records.summarize(job, list(state.history), first_epoch=state.first_epoch,
                                wall_seconds=time.perf_counter() - run.wall_start,
                                clock=run.clock, mode="custom",
                                # Epochs may have run at several sizes: what was trained.
                                trained=(state.train_steps, state.images_trained),
                                train_step_traces=run.train_step.experimental_get_tracing_count(),
                                elastic={"starts": state.starts, "commits": run.commits,
                                         "commit_seconds": run.commit_seconds})
    hooks.close()
    job_lib.finish(summary, run.model, run.optimizer, model_dir=config.model_dir,
                   export=config.export)
    return summary


def _train_rest_of_epoch(state: TrainingState, run: _Run, job: job_lib.Job,
                         run_loop: loop.Loop) -> None:
    """Trains examples [state.position, end of epoch) on the current workers, committing."""
    topology, batching = job.topology, job.batching
    if state.epoch_examples == 0:  # a new epoch: its length follows the current size
        state.epoch_examples = job.steps_per_epoch * batching.global_batch_size
    train_split = job.source.train_split
    order = splits.epoch_permutation(run.config.seed, state.epoch, len(train_split))
    batches, step_examples = resharding.rest_of_epoch(
        order, state.position, state.epoch_examples, batching.per_rank_batch_size,
        topology.rank, topology.size)
    if not batches:
        return
    epoch = hooks_lib.Epoch(state.epoch, state.steps_in_epoch + len(batches),
                            first_step=state.steps_in_epoch + 1,
                            steps_before=state.train_steps - state.steps_in_epoch,
                            loss_before=state.loss_sum, restart_position=state.position)
    run_loop.train(resharding.batches_dataset(train_split, batches,
                                              batching.per_rank_batch_size, job.dtype),
                   epoch, Commits(state, run, step_examples, epoch.first_step))


class Commits:
    """The loop's control in elastic training: the state committed every --commit_every
    steps and after the epoch's last (the loop checks every loss before: nothing
    non-finite is ever committed). No signal stops an elastic run mid-epoch."""
    requests = None  # the step returns its loss only

    def __init__(self, state: TrainingState, run: _Run, step_examples, first_step: int):
        self.state, self.run = state, run
        self.step_examples, self.first_step = step_examples, first_step
        self._mark = time.perf_counter()

    def before_step(self) -> None:
        pass

    def after_step(self, epoch: int, step: int, agreed) -> preemption.Decision:
        state = self.state
        examples = self.step_examples[step - self.first_step]
        state.position += examples
        state.images_trained += examples
        due = (step - state.steps_in_epoch == self.run.config.commit_every
               or state.position == state.epoch_examples)
        return preemption.Decision(save=due)

    def at_epoch_end(self, epoch: int) -> preemption.Decision:
        return preemption.Decision()  # committed after the last step

    def save(self, epoch: int, step: int, loss_sum: float, stop: bool) -> None:
        state, now = self.state, time.perf_counter()
        state.train_steps += step - state.steps_in_epoch
        state.steps_in_epoch, state.loss_sum = step, loss_sum
        state.epoch_seconds += now - self._mark
        self._mark = now
        state.commit()
        self.run.commits += 1
        self.run.commit_seconds += time.perf_counter() - now
