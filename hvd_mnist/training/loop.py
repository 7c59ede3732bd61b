"""The custom training loop: epochs of `step.make_train_step`, evaluation, checkpoints.

`train_epoch` runs one epoch's steps and checks their loss; `train_and_evaluate`
is the run: start (job.py), rank 0's state on every rank before step 1, the
epochs, and what the run leaves (job.finish). elastic.py runs the same
`train_epoch` under hvd.elastic.run.
"""

import time

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist import config as config_lib
from hvd_mnist.outputs import checkpoint, progress, records, run_identity, timing
from hvd_mnist.process import keras_compat, runtime
from hvd_mnist.training import (job as job_lib, model as model_lib, preemption,
                                step as step_lib)

def train_epoch(train_step, batches, *, epoch: int, steps: int, clock: timing.StepClock,
                monitor: progress.TrainingMonitor, first_step: int = 1,
                loss_before: float = 0.0, after_step=None, control=None) -> float:
    """The epoch's steps `first_step`..`steps` over `batches`; returns the epoch's mean
    loss (`loss_before`: the sum of the losses of the steps before `first_step`), every
    loss checked finite.

    `monitor` shows progress and, every --log_every steps, logs to TensorBoard;
    `after_step(step, loss)`, if given, runs after each step (elastic.py commits
    there, and starts an epoch again after a reset at a `first_step` > 1).
    `control` (preemption.StepControl), if given: the step also returns the ranks' agreed
    requests, and after the steps they decide on, a mid-epoch checkpoint or a stop.
    """
    loss_total = 0.0  # becomes a tensor at the first step: summed on the device, read once
    finite_check = step_lib.DeferredLossCheck()

    def act(decision, step):
        if decision.save:
            finite_check.flush()  # nothing non-finite is ever saved
            control.save(epoch, step, loss_before + float(loss_total), decision.stop)

    for step, (images, labels) in enumerate(batches, start=first_step):
        run_step = (epoch - 1) * steps + step
        if control:
            control.before_step()
            loss, agreed = train_step(images, labels)
        else:
            loss = train_step(images, labels)
        clock.step_done()
        finite_check.push(loss, f"step {run_step} (epoch {epoch}, step {step} of {steps})")
        loss_total += loss
        monitor.step_done(step, lambda: float(loss_total))
        if after_step:
            after_step(step, loss)
        if control:
            act(control.after_step(epoch, step, agreed), step)
    finite_check.flush()  # before any checkpoint of this epoch
    if control:
        act(control.at_epoch_end(epoch), steps)
    return (loss_before + float(loss_total)) / steps


def restore_and_broadcast(config: config_lib.TrainConfig, store: checkpoint.CheckpointStore,
                          model, optimizer) -> checkpoint.Restored:
    """Rank 0's state, fresh or restored with --resume, on every rank; returns where the
    run is (rank 0's Restored, on every rank).

    The optimizer's slots exist by now (train_and_evaluate builds them), so this one
    broadcast, before step 1, covers the full state. Horovod's examples broadcast
    after the first step instead, because only that step creates the slots; their
    step 1 averages gradients taken at different weights on each rank.
    """
    restored = runtime.on_chief(
        lambda: store.restore_latest() if config.resume else checkpoint.Restored(0))
    hvd.broadcast_variables(keras_compat.state_variables(model, optimizer), root_rank=0)
    runtime.on_chief(lambda: records.record_start(
        config, hvd.size(), resumed_after_epoch=restored.epoch if config.resume else None))
    log_resume(config, restored, store)
    return restored


def log_resume(config: config_lib.TrainConfig, restored: checkpoint.Restored,
               store: checkpoint.CheckpointStore) -> None:
    if config.resume:
        where = (f"at step {restored.steps_done + 1} of epoch {restored.epoch + 1}"
                 if restored.steps_done else f"after epoch {restored.epoch}")
        runtime.log(f"resuming {where} from {restored.path}" if restored.path else
                    f"--resume: no checkpoint in {store.directory}, starting fresh")
        if restored.changes:
            runtime.log(restored.changes)


def train_and_evaluate(config: config_lib.TrainConfig) -> dict:
    """Trains with the custom loop on every rank; returns the run's summary.

    Raises preemption.Stopped after a SIGTERM or SIGINT, once the checkpoint is saved.
    """
    signals = preemption.StopSignals().install()
    try:
        summary = _train(config, signals)
    except preemption.Stopped:
        raise  # still handled until main.py exits: a second SIGTERM must not cut its line
    except BaseException:
        signals.uninstall()
        raise
    signals.uninstall()
    return summary


def _train(config: config_lib.TrainConfig, signals: preemption.StopSignals) -> dict:
    wall_start = time.perf_counter()
    job = job_lib.start(config)
    topology, batching, steps = job.topology, job.batching, job.steps_per_epoch

    tf.keras.utils.set_random_seed(config.seed)
    model = job_lib.build_model(config, job)
    optimizer = job_lib.scheduled_optimizer(config, job)
    optimizer.build(model.trainable_variables)  # the slots, before the broadcast
    identity = run_identity.of_run(config, batching, topology.size, steps, model, optimizer)
    store = checkpoint.CheckpointStore(config.model_dir, model, optimizer,
                                       config.keep_checkpoints, identity)
    restored = restore_and_broadcast(config, store, model, optimizer)
    start = restored.position

    control = preemption.control_for_run(config, steps, store, signals)
    train_step = step_lib.train_step_for(config, model, optimizer, control.requests)
    eval_step = step_lib.make_eval_step(model)
    eval_batches = job.source.eval_batches(batching.per_rank_batch_size)
    runtime.log(f"training on {topology.size} worker(s): {steps} steps/epoch of "
                f"{batching.global_batch_size} images ({batching.per_rank_batch_size} per "
                f"worker), {config.optimizer} learning rate {batching.learning_rate:g}, "
                f"epochs {start.first_epoch}..{config.epochs}")

    history, clock = [], timing.StepClock(batching.global_batch_size)
    monitor = progress.monitor_for_run(config, epochs=config.epochs, steps_per_epoch=steps,
                                       images_per_step=batching.global_batch_size,
                                       learning_rate=lambda: float(optimizer.learning_rate))
    for epoch in range(start.first_epoch, config.epochs + 1):
        first_step = start.first_step if epoch == start.first_epoch else 1
        # Masks differ per rank, as they would on separate machines, and depend
        # only on (seed, rank, epoch, step), so a resumed run draws the same ones.
        model_lib.reseed_dropout(model, (config.seed, topology.rank, epoch), first_step - 1,
                                 batching.per_rank_batch_size)
        batches = job.source.train_batches(seed=config.seed, epoch=epoch, steps=steps,
                                           per_rank_batch_size=batching.per_rank_batch_size,
                                           first_step=first_step)
        epoch_start = time.perf_counter()
        clock.epoch_started()
        monitor.start_epoch(epoch, done_steps=first_step - 1)
        try:
            train_loss = train_epoch(
                train_step, batches, epoch=epoch, steps=steps, clock=clock, monitor=monitor,
                first_step=first_step, control=control,
                loss_before=restored.loss_sum if epoch == start.first_epoch else 0.0)
        except preemption.Stopped:
            monitor.close()
            raise
        record = records.epoch_record(
            epoch, train_loss, step_lib.evaluate(eval_step, eval_batches),
            train_seconds=time.perf_counter() - epoch_start,
            images_trained=(steps - first_step + 1) * batching.global_batch_size)
        history.append(record)
        monitor.end_epoch(record)
        runtime.on_chief(lambda: store.save(epoch))
        control.checkpoint_written()
        if records.end_epoch(config, record, config.epochs):
            break

    summary = records.summarize(job, history, first_epoch=start.first_epoch,
                                wall_seconds=time.perf_counter() - wall_start, clock=clock,
                                steps_done_before=start.steps_done, mode="custom",
                                train_step_traces=train_step.experimental_get_tracing_count())
    monitor.close()
    job_lib.finish(config, summary, model, optimizer)
    return summary
