"""Elastic training (--elastic): the custom loop under hvd.elastic.run, workers may leave and join.

The state (elastic_state.py) holds every model and optimizer variable and the
run's progress (epoch, and position: how many examples of the epoch's
permutation are done). On a reset Horovod re-initialises with the new set of
workers; the survivors have restored the last commit, the state's sync hands
rank 0's state to everyone (joining workers included), and `_train` starts
again from there: the job re-sized for the new workers (job.resize: batch and
learning rate as at start), and the rest of the epoch, examples
[position, end), split over them (data/resharding.py). The steps, evaluation,
progress, TensorBoard, checkpoints, records and export are the custom loop's.
"""

import dataclasses
import time
import uuid

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError

from hvd_mnist import config as config_lib
from hvd_mnist.data import resharding, splits
from hvd_mnist.errors import UserFacingError
from hvd_mnist.outputs import (checkpoint, ownership, progress, records, run_identity,
                               tensorboard_log, timing)
from hvd_mnist.process import keras_compat, runtime
from hvd_mnist.training import job as job_lib, loop, model as model_lib, step as step_lib
from hvd_mnist.training.elastic_state import TrainingState


def check_supported(config: config_lib.TrainConfig) -> None:
    if config.input != "memory":
        raise UserFacingError(
            "--elastic needs --input=memory: resharding the rest of an epoch after a reset "
            "picks examples by their position in the epoch's permutation")
    if config.lr_schedule != "constant":
        raise UserFacingError(
            "--elastic needs --lr_schedule=constant: a schedule counts steps, and a resize "
            "changes the number of steps per epoch (--recipe=fast sets warmup_linear)")
    if config.backward_passes_per_step > 1:
        raise UserFacingError(
            "--elastic needs --backward_passes_per_step=1: a commit between the batches of "
            "one update would leave their accumulated gradients out of the state")


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
    """Trains with the custom loop under hvd.elastic.run; returns the run's summary."""
    check_supported(config)
    wall_start = time.perf_counter()
    job = job_lib.start_process(config)
    tf.keras.utils.set_random_seed(config.seed)
    model = job_lib.build_model(config, job)
    optimizer = job_lib.scheduled_optimizer(config, job)
    # Before the state captures the optimizer's variables: a state made before the
    # slots exist leaves them out, and a joining worker would later create them
    # alone (Horovod's tracker: new workers hang).
    optimizer.build(model.trainable_variables)
    run = _Run(config, job, model, optimizer, step_lib.train_step_for(config, model, optimizer),
               step_lib.make_eval_step(model), timing.StepClock(job.batching.global_batch_size),
               tensorboard_log.TensorBoardLog(config.model_dir), wall_start)
    state = TrainingState(
        keras_compat.state_variables(model, optimizer),
        lambda first: _prepare_on_chief(run, state.owner_job, first),
        epoch=1, first_epoch=1, position=0, epoch_examples=0, loss_sum=0.0,
        steps_in_epoch=0, epoch_seconds=0.0, train_steps=0, images_trained=0, starts=0,
        finished=False, history=(), owner_job="")
    return hvd.elastic.run(_reporting_lost_peers(_train))(state, run)


def _reporting_lost_peers(train_fn):
    """Makes a collective that failed because a peer died a HorovodInternalError.

    hvd.elastic.run recognises one only if TF's message names a Horovod op type; ours
    names the op ("Detected at node train_loss"), and then hvd.elastic.run swallows
    the error and returns None: this worker would exit 0, and the driver, seeing a
    success, would end the whole job.
    """
    def wrapper(state, run):
        try:
            return train_fn(state, run)
        except tf.errors.OpError as e:
            if "Horovod" in e.message:
                raise HorovodInternalError(e) from e
            raise
    return wrapper


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
    loop.log_resume(config, restored, store)
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
    # The rate scales with the workers as at start (a constant rate: check_supported).
    run.optimizer.learning_rate = batching.learning_rate
    run.clock.images_per_step = batching.global_batch_size
    store = _store(run, job)  # in whichever process is rank 0 now
    monitor = progress.monitor_for_run(
        config, epochs=config.epochs, steps_per_epoch=job.steps_per_epoch,
        images_per_step=batching.global_batch_size,
        learning_rate=lambda: float(run.optimizer.learning_rate), board=run.board)
    state.starts += 1
    state.save()  # so a later restore cannot bring back an earlier start's number
    runtime.log(f"elastic: start {state.starts} on {topology.size} worker(s) at epoch "
                f"{state.epoch}, example {state.position} of {state.epoch_examples or 'its'} "
                f"epoch: {batching.per_rank_batch_size} per worker, {config.optimizer} "
                f"learning rate {batching.learning_rate:g}")
    eval_batches = job.source.eval_batches(batching.per_rank_batch_size)

    while state.epoch <= config.epochs and not state.finished:
        _train_rest_of_epoch(state, run, job, monitor)
        record = records.epoch_record(
            state.epoch, state.loss_sum / state.steps_in_epoch,
            step_lib.evaluate(run.eval_step, eval_batches), train_seconds=state.epoch_seconds,
            images_trained=state.epoch_examples)
        monitor.end_epoch(record)
        epoch = state.epoch
        runtime.on_chief(lambda: store.save(epoch))
        state.finished = records.end_epoch(config, record, config.epochs)
        state.history = state.history + (record,)
        state.epoch, state.position, state.epoch_examples = epoch + 1, 0, 0
        state.loss_sum, state.steps_in_epoch, state.epoch_seconds = 0.0, 0, 0.0
        state.commit()

    summary = records.summarize(job, list(state.history), first_epoch=state.first_epoch,
                                wall_seconds=time.perf_counter() - run.wall_start,
                                clock=run.clock, mode="custom",
                                train_step_traces=run.train_step.experimental_get_tracing_count())
    # Epochs may have run at several sizes: count what was trained, not steps x batch.
    summary.update(steps=state.train_steps,
                   elastic={"starts": state.starts, "commits": run.commits,
                            "commit_seconds": run.commit_seconds},
                   images_per_second=(state.images_trained / summary["train_seconds"]
                                      if summary["train_seconds"] else 0.0))
    monitor.close()
    job_lib.finish(config, summary, run.model, run.optimizer)
    return summary


def _train_rest_of_epoch(state: TrainingState, run: _Run, job: job_lib.Job,
                         monitor: progress.TrainingMonitor) -> None:
    """Trains examples [state.position, end of epoch) on the current workers, committing."""
    config, topology, batching = run.config, job.topology, job.batching
    epoch = state.epoch
    if state.epoch_examples == 0:  # a new epoch: its length follows the current size
        state.epoch_examples = job.steps_per_epoch * batching.global_batch_size
    train_split = job.source.train_split
    order = splits.epoch_permutation(config.seed, epoch, len(train_split))
    batches, step_examples = resharding.rest_of_epoch(
        order, state.position, state.epoch_examples, batching.per_rank_batch_size,
        topology.rank, topology.size)
    if not batches:
        return
    # As loop.py at an epoch's start; a restart within the epoch draws masks from
    # where it restarts (a run without resets is exactly a normal run).
    seed_words = (config.seed, topology.rank, epoch) + ((state.position,) if state.position
                                                         else ())
    model_lib.reseed_dropout(run.model, seed_words)
    pending = []  # (loss, where) of the steps since the last commit
    mark = [time.perf_counter()]

    def commit():
        for loss, where in pending:  # nothing non-finite is ever committed
            step_lib.check_finite(float(loss), where)
        now = time.perf_counter()
        state.loss_sum += sum(float(loss) for loss, _ in pending)
        state.steps_in_epoch += len(pending)
        state.train_steps += len(pending)
        state.epoch_seconds += now - mark[0]
        mark[0] = now
        pending.clear()
        state.commit()
        run.commits += 1
        run.commit_seconds += time.perf_counter() - now

    def after_step(step, loss):
        index = step - first_step
        state.position += step_examples[index]
        state.images_trained += step_examples[index]
        pending.append((loss, f"step {state.train_steps + len(pending) + 1} (epoch {epoch}, "
                              f"step {state.steps_in_epoch + len(pending) + 1})"))
        if len(pending) == config.commit_every or state.position == state.epoch_examples:
            commit()

    first_step = state.steps_in_epoch + 1
    epoch_steps = state.steps_in_epoch + len(batches)
    run.clock.epoch_started()
    monitor.start_epoch(epoch, steps=epoch_steps, done_steps=state.steps_in_epoch,
                        steps_before=state.train_steps - state.steps_in_epoch)
    loop.train_epoch(run.train_step,
                     resharding.batches_dataset(train_split, batches,
                                                batching.per_rank_batch_size, job.dtype),
                     epoch=epoch, steps=epoch_steps, first_step=first_step, clock=run.clock,
                     monitor=monitor, after_step=after_step)
