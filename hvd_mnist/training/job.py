"""What every trainer does before its first step and after its last.

The custom loop (loop.py), the Keras fit baseline (keras_fit.py) and elastic
training (elastic.py) all start and finish here, so they run on the same
devices, thread pools, batches and data, and leave the same files behind.
"""

import dataclasses
import os

import tensorflow as tf

from hvd_mnist import config as config_lib
from hvd_mnist.data import inputs
from hvd_mnist.outputs import export as export_lib, files, ownership, records
from hvd_mnist.training import model as model_lib, precision
from hvd_mnist.worker import runtime


@dataclasses.dataclass(frozen=True)
class Job:
    topology: runtime.Topology
    batching: config_lib.Batching
    source: "inputs.MemoryInput | inputs.RecordInput"  # where batches come from
    steps_per_epoch: int
    dtype: tf.DType  # of the model, its inputs and its optimizer (precision.variable_dtype)
    threads_per_rank: int = 0


def start(config: config_lib.TrainConfig) -> Job:
    """Horovod, devices and threads, then everything that can be validated before training.

    Every check here runs on every rank and a failure on any rank stops them all
    (`runtime.on_every_rank`, `runtime.on_chief`), so a bad input is reported by
    every rank, not just one.
    """
    topology, threads = start_horovod(deterministic=config.deterministic,
                                      threads_per_rank=config.threads_per_rank)
    job = runtime.on_every_rank(lambda: open_job(config, topology, threads))
    # After the checks of the input, which write nothing, and before anything is written.
    taken_over = runtime.on_chief(lambda: ownership.take(config.model_dir))
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    for line in (taken_over,
                 precision.describe(config.precision, fp16_allreduce=config.fp16_allreduce),
                 precision.cpu_warning(config.precision, has_gpu=has_gpu)):
        if line:
            runtime.log(line)
    return job


def start_process(config: config_lib.TrainConfig) -> Job:
    """`start` without any collective operation, so a worker joining an elastic job,
    whose peers are waiting in their state's sync, can run it alone."""
    return open_job(config, *start_horovod(deterministic=config.deterministic,
                                           threads_per_rank=config.threads_per_rank))


def start_horovod(*, deterministic: bool, threads_per_rank: int) -> tuple[runtime.Topology, int]:
    """Horovod, this process's GPU and its thread pools (threads_per_rank threads, or with 0
    the host's cores shared by its ranks); returns where it runs and its number of threads."""
    runtime.configure_determinism(deterministic)
    runtime.configure_cycle_time(has_gpu=bool(tf.config.list_physical_devices("GPU")))
    topology = runtime.init_horovod()  # Horovod: hvd.init(), then where this rank runs
    runtime.configure_gpus(topology.local_rank)  # Horovod: one GPU per process, by local rank
    threads = runtime.threads_per_rank(threads_per_rank, topology.local_size,
                                       runtime.available_cpus())
    runtime.configure_threads(threads)
    return topology, threads


def open_job(config: config_lib.TrainConfig, topology: runtime.Topology, threads: int) -> Job:
    """Batching, the input and the steps per epoch, for one rank (may raise UserFacingError)."""
    precision.check_isa_cap(config.precision,
                            has_gpu=bool(tf.config.list_physical_devices("GPU")))
    dtype = tf.as_dtype(precision.variable_dtype(config.precision))
    batching = config_lib.resolve_batching(config, topology.size)  # before reading any data
    source = inputs.open_input(config.input, config.data_dir,
                               inputs.Shard(topology.rank, topology.size),
                               config.shuffle_buffer, dtype)
    return _sized(config, topology, batching, source, dtype, threads)


def resize(config: config_lib.TrainConfig, job: Job, topology: runtime.Topology) -> Job:
    """The job on another set of workers (elastic): the same data, with batching and steps
    resolved for them as at the start."""
    source = job.source.for_shard(inputs.Shard(topology.rank, topology.size))
    return _sized(config, topology, config_lib.resolve_batching(config, topology.size), source,
                  job.dtype, job.threads_per_rank)


def _sized(config, topology, batching, source, dtype, threads) -> Job:
    steps = config_lib.resolve_steps_per_epoch(
        source.usable_train_examples(), batching.global_batch_size,
        config.max_steps_per_epoch, config.backward_passes_per_step)
    return Job(topology, batching, source, steps, dtype, threads)


def learning_rate(config: config_lib.TrainConfig, job: Job):
    """The run's (scaled) learning rate: a number, or a schedule over the whole run.

    The schedule reads the optimizer's step counter, which checkpoints keep, so
    a resumed run continues the schedule where it stopped.
    """
    rate = job.batching.learning_rate  # Horovod: scaled with the workers (resolve_batching)
    if config.lr_schedule == "warmup_linear":
        rate = model_lib.WarmupLinearDecay(
            rate, warmup_steps=round(config.warmup_epochs * job.steps_per_epoch),
            total_steps=config.epochs * job.steps_per_epoch)
    return rate


def scheduled_optimizer(config: config_lib.TrainConfig, job: Job):
    """The custom loop's optimizer, with the run's learning rate (and loss scaling with
    mixed_float16)."""
    return precision.with_loss_scaling(
        config.precision, model_lib.make_optimizer(config.optimizer, learning_rate(config, job)))


def finish(summary: dict, model, optimizer, *, model_dir: str, export: bool) -> None:
    """Rank 0 writes summary.json and (with --export) the exported model, and prints the
    summary; every rank calls it."""
    runtime.on_chief(lambda: files.write_json(os.path.join(model_dir, "summary.json"),
                                              summary))
    runtime.log(records.format_summary(summary))
    if export:
        directory = export_lib.export_on_chief(model_dir, model, summary)
        runtime.log(f"exported the model to {directory}: python -m hvd_mnist.predict "
                    f"--model={directory} FILE...")
    ownership.release(model_dir)  # rank 0's, the only one holding it


