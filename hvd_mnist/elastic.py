"""Elastic training (--elastic): the custom loop under hvd.elastic.run, workers may leave and join.

`TrainingState` holds every model and optimizer variable and the run's progress
(epoch, and position: how many examples of the epoch's permutation are done),
committed to host memory every --commit_every steps and at every epoch end. On
a reset Horovod re-initialises with the new set of workers; the survivors have
restored the last commit, `TrainingState.sync` hands rank 0's state to everyone
(joining workers included), and `_train` starts again from there: world size and
rank re-read, batch and learning rate resolved for the new size as at start, and
the rest of the epoch, examples [position, end), split over the new workers.
The steps, evaluation, checkpoints and files are those of train.py and job.py.
"""

import dataclasses
import hashlib
import json
import os
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError

from hvd_mnist import (checkpoint, config as config_lib, data, job as job_lib, keras_compat,
                       model as model_lib, run_identity, runtime, timing, train)
from hvd_mnist.errors import UserFacingError


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
        # (train.py's broadcast before step 1, moved here): fresh weights, a --resume
        # restore and a joining worker's start all take this path, before any step.
        first_sync = not self._synced_before
        for name, value in runtime.on_chief(lambda: self._chief_prepare(first_sync)).items():
            setattr(self, name, value)
        hvd.broadcast_variables(self._variables, root_rank=0)
        hvd.elastic.ObjectState.save(self)  # rank 0's progress, with its updates, is broadcast
        super().sync()
        self._save_variables()
        self._synced_before = True

    def _save_variables(self):
        # Copies: an array viewing a variable's buffer could change with the next step.
        self._values = [variable.numpy().copy() for variable in self._variables]


def rest_of_epoch(order: np.ndarray, start: int, end: int, per_rank_batch_size: int,
                  rank: int, size: int):
    """This rank's batches of examples order[start:end], and each step's examples over all ranks.

    Whole global batches are split as data.rank_batch_indices splits them (so an
    epoch that starts at 0 is exactly a normal run's); what is left after them (only
    after a resize) is one last, shorter step, split as evenly as possible.
    """
    rest = order[start:end]
    global_batch_size = per_rank_batch_size * size
    full_steps = len(rest) // global_batch_size
    batches = list(data.rank_batch_indices(rest, full_steps, per_rank_batch_size, rank, size))
    step_examples = [global_batch_size] * full_steps
    tail = rest[full_steps * global_batch_size:]
    if len(tail):
        batches.append(tail[rank::size])
        step_examples.append(len(tail))
    return batches, step_examples


def batches_dataset(split: data.Split, batches: list, per_rank_batch_size: int,
                    dtype=tf.float32) -> tf.data.Dataset:
    """The batches as data.batches_from_indices makes them, plus a last short (even empty) one."""
    full = [b for b in batches if len(b) == per_rank_batch_size]
    dataset = data.batches_from_indices(
        split, np.concatenate(full) if full else np.zeros([0], np.int64), per_rank_batch_size,
        dtype)
    if len(full) < len(batches):
        images, labels = tf.constant(split.images), tf.constant(split.labels)
        tail = tf.data.Dataset.from_tensors(batches[-1].astype(np.int64)).map(
            lambda i: data.normalize(tf.gather(images, i), tf.gather(labels, i), dtype))
        dataset = dataset.concatenate(tail)
    return dataset


class ExampleLog:
    """Testing aid (--example_log): one JSON line per event, per process, flushed at once
    so a SIGKILLed process's lines up to its death are kept."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self._file = open(os.path.join(directory, f"examples-{os.getpid()}.jsonl"), "a",
                          buffering=1)

    def write(self, **record) -> None:
        self._file.write(json.dumps({**record, "unix_time": time.time()}) + "\n")


def weights_digest(variables) -> str:
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()


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
    job: job_lib.Job  # as first started; topology and batching are re-read at every start
    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    train_step: object
    eval_step: object
    clock: timing.StepClock
    example_log: ExampleLog | None
    wall_start: float


def train_and_evaluate(config: config_lib.TrainConfig) -> dict:
    """Trains with the custom loop under hvd.elastic.run; returns the run's summary."""
    check_supported(config)
    wall_start = time.perf_counter()
    job = job_lib.start_process(config)
    tf.keras.utils.set_random_seed(config.seed)
    model = model_lib.build_model(dropout=config.dropout, dtype=job.dtype)
    optimizer = job_lib.scheduled_optimizer(config, job)
    # Before the state captures the optimizer's variables: a state made before the
    # slots exist leaves them out, and a joining worker would later create them
    # alone (Horovod's tracker: new workers hang).
    optimizer.build(model.trainable_variables)
    run = _Run(config, job, model, optimizer,
               train.train_step_for(config, model, optimizer),
               train.make_eval_step(model), timing.StepClock(job.batching.global_batch_size),
               ExampleLog(config.example_log) if config.example_log else None, wall_start)
    state = TrainingState(
        keras_compat.state_variables(model, optimizer), lambda first: _prepare_on_chief(run, first),
        epoch=1, first_epoch=1, position=0, epoch_examples=0, loss_sum=0.0,
        steps_in_epoch=0, epoch_seconds=0.0, train_steps=0, images_trained=0, starts=0,
        finished=False, history=())
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


def _store(run: _Run, batching: config_lib.Batching, size: int, steps: int):
    record = run_identity.of_run(run.config, batching, size, steps, run.model, run.optimizer)
    return checkpoint.CheckpointStore(run.config.model_dir, run.model, run.optimizer,
                                      run.config.keep_checkpoints, record)


def _prepare_on_chief(run: _Run, first_sync: bool) -> dict:
    """Rank 0, before its state is broadcast: at the job's start, model_dir and --resume."""
    if not first_sync:
        return {}
    config = run.config
    job_lib.make_model_dir(config.model_dir)
    store = _store(run, run.job.batching, run.job.topology.size, run.job.steps_per_epoch)
    restored = store.restore_latest() if config.resume else checkpoint.Restored(0)
    job_lib.record_start(config, hvd.size(),
                         resumed_after_epoch=restored.epoch if config.resume else None)
    if config.resume:
        runtime.log(f"resuming after epoch {restored.epoch} from {restored.path}"
                    if restored.epoch else
                    f"--resume: no checkpoint in {store.directory}, starting fresh")
        if restored.changes:
            runtime.log(restored.changes)
    return {"epoch": restored.epoch + 1, "first_epoch": restored.epoch + 1}


def _train(state: TrainingState, run: _Run) -> dict:
    """One (re)start: from the synced state to the end of the run, at the current size."""
    config = run.config
    topology = runtime.Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    batching = config_lib.resolve_batching(config, topology.size)
    # (job.source's shard is the first start's: elastic.py picks examples itself.)
    train_split, test_split = run.job.source.train_split, run.job.source.test_split
    steps = config_lib.steps_per_epoch(len(train_split), batching.global_batch_size,
                                       config.steps_per_epoch)
    job = dataclasses.replace(run.job, topology=topology, batching=batching,
                              steps_per_epoch=steps)
    run.optimizer.learning_rate = batching.learning_rate
    run.clock.images_per_step = batching.global_batch_size
    store = _store(run, batching, topology.size, steps)  # in whichever process is rank 0 now
    state.starts += 1
    state.save()  # so a later restore cannot bring back an earlier start's number
    runtime.log(f"elastic: start {state.starts} on {topology.size} worker(s) at epoch "
                f"{state.epoch}, example {state.position} of {state.epoch_examples or 'its'} "
                f"epoch: {batching.per_rank_batch_size} per worker, {config.optimizer} "
                f"learning rate {batching.learning_rate:g}")
    if run.example_log:
        # The host too: the driver's first rank order is not the hosts file's (it orders
        # hosts as a Python set does), so a test removing a worker's host must look it up.
        run.example_log.write(start=state.starts, rank=topology.rank, size=topology.size,
                              host=os.environ.get("HOROVOD_HOSTNAME"), epoch=state.epoch,
                              position=state.position, weights=weights_digest(state.variables))
    eval_batches = data.batches_from_indices(
        test_split, data.eval_indices(len(test_split), topology.rank, topology.size),
        batching.per_rank_batch_size, job.dtype)

    while state.epoch <= config.epochs and not state.finished:
        _train_rest_of_epoch(state, run, job)
        record = job_lib.epoch_record(
            state.epoch, state.loss_sum / state.steps_in_epoch,
            train.evaluate(run.eval_step, eval_batches), train_seconds=state.epoch_seconds,
            images_trained=state.epoch_examples)
        epoch = state.epoch
        runtime.on_chief(lambda: store.save(epoch))
        state.finished = job_lib.end_epoch(config, record, config.epochs)
        state.history = state.history + (record,)
        state.epoch, state.position, state.epoch_examples = epoch + 1, 0, 0
        state.loss_sum, state.steps_in_epoch, state.epoch_seconds = 0.0, 0, 0.0
        state.commit()

    if config.export_weights_dir:
        job_lib.export_weights(config.export_weights_dir, run.model, topology.rank)
    history = list(state.history)
    summary = job_lib.summarize(job, history, first_epoch=state.first_epoch,
                                wall_seconds=time.perf_counter() - run.wall_start,
                                clock=run.clock, mode="custom",
                                train_step_traces=run.train_step.experimental_get_tracing_count())
    # Epochs may have run at several sizes: count what was trained, not steps x batch.
    summary.update(steps=state.train_steps, elastic={"starts": state.starts},
                   images_per_second=(state.images_trained / summary["train_seconds"]
                                      if summary["train_seconds"] else 0.0))
    job_lib.finish(config, summary, run.model)
    return summary


def _train_rest_of_epoch(state: TrainingState, run: _Run, job: job_lib.Job) -> None:
    """Trains examples [state.position, end of epoch) on the current workers, committing."""
    config, topology, batching = run.config, job.topology, job.batching
    epoch = state.epoch
    if state.epoch_examples == 0:  # a new epoch: its length follows the current size
        state.epoch_examples = job.steps_per_epoch * batching.global_batch_size
    train_split = job.source.train_split
    order = data.epoch_permutation(config.seed, epoch, len(train_split))
    batches, step_examples = rest_of_epoch(order, state.position, state.epoch_examples,
                                           batching.per_rank_batch_size, topology.rank,
                                           topology.size)
    if not batches:
        return
    # As train.py at an epoch's start; a restart within the epoch draws masks from
    # where it restarts (a run without resets is exactly a normal run).
    seed_words = (config.seed, topology.rank, epoch) + ((state.position,) if state.position
                                                         else ())
    model_lib.reseed_dropout(run.model, seed_words)
    pending = []  # (loss, where) of the steps since the last commit
    mark = [time.perf_counter()]

    def commit():
        for loss, where in pending:  # nothing non-finite is ever committed
            train.check_finite(float(loss), where)
        now = time.perf_counter()
        state.loss_sum += sum(float(loss) for loss, _ in pending)
        state.steps_in_epoch += len(pending)
        state.train_steps += len(pending)
        state.epoch_seconds += now - mark[0]
        mark[0] = now
        pending.clear()
        state.commit()
        if run.example_log:
            run.example_log.write(commit=state.starts, rank=topology.rank, size=topology.size,
                                  epoch=epoch, position=state.position)

    def after_step(step, loss):
        first_example = state.position
        state.position += step_examples[step - 1]
        state.images_trained += step_examples[step - 1]
        pending.append((loss, f"step {state.train_steps + len(pending) + 1} (epoch {epoch}, "
                              f"step {state.steps_in_epoch + len(pending) + 1})"))
        if run.example_log:
            run.example_log.write(step=state.starts, rank=topology.rank, size=topology.size,
                                  epoch=epoch, position=first_example,
                                  examples=batches[step - 1].tolist())
        if len(pending) == config.commit_every or state.position == state.epoch_examples:
            commit()

    run.clock.epoch_started()
    train.train_epoch(config, run.train_step,
                      batches_dataset(train_split, batches, batching.per_rank_batch_size,
                                      job.dtype),
                      epoch=epoch, steps=len(batches), model=run.model, clock=run.clock,
                      after_step=after_step)
