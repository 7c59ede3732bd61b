"""Process-level set-up: Horovod, devices, thread pools, and rank-0 helpers.

Everything that must happen before TensorFlow starts its runtime lives here,
and every rank-0-only side effect goes through `is_chief()`.
"""

import dataclasses
import os
import sys

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.errors import CollectiveError, UserFacingError


@dataclasses.dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int


def configure_determinism(deterministic: bool, environ=os.environ, tf_config=tf.config) -> None:
    """Makes a run bitwise repeatable for a given -np and seed; must run before hvd.init.

    Tensor fusion packs whichever gradients are ready into one buffer, so the
    allreduce summation order, and the weights' last bits, depend on timing;
    threshold 0 allreduces each tensor on its own. TF's determinism covers the rest.
    """
    if not deterministic:
        return
    environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    tf_config.experimental.enable_op_determinism()


# Horovod's background thread negotiates with every rank once a cycle, busy or idle. Its
# default cycle, 1 ms, suits a GPU, whose step does not need the host's cores; on the CPU
# the thread takes those cores from the step. 5 ms ran the bench's job at 1.07x the steady
# images/s at -np 2, 1.04x at -np 4 and the same at -np 1 on the AVX2-only EPYC
# (reports/lever_cycle_time_epyc_avx2.md).
CPU_CYCLE_TIME_MS = "5"


def configure_cycle_time(has_gpu: bool, environ=os.environ) -> None:
    """On a host without a GPU, Horovod's cycle at CPU_CYCLE_TIME_MS unless the user set
    HOROVOD_CYCLE_TIME (or horovodrun's --cycle-time-ms); must run before hvd.init."""
    if not has_gpu:
        environ.setdefault("HOROVOD_CYCLE_TIME", CPU_CYCLE_TIME_MS)


def init_horovod() -> Topology:
    hvd.init()
    return topology()


def topology() -> Topology:
    """Where this process runs now (under --elastic, it changes at every reset)."""
    return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def configure_gpus(local_rank: int, tf_config=tf.config) -> list:
    """Memory growth on every GPU, then only this process's GPU stays visible.

    Must run before any TF op; `tf_config` is injectable so it is testable
    without a GPU. Returns the GPUs this process will use ([] on CPU hosts).
    """
    gpus = tf_config.list_physical_devices("GPU")
    for gpu in gpus:
        tf_config.experimental.set_memory_growth(gpu, True)
    if not gpus:
        return []
    if local_rank >= len(gpus):
        raise RuntimeError(f"local rank {local_rank} has no GPU: this host has {len(gpus)}; "
                           "start at most one process per GPU")
    tf_config.set_visible_devices(gpus[local_rank], "GPU")
    return [gpus[local_rank]]


def threads_per_rank(requested: int, local_size: int, cpu_count: int) -> int:
    """TF threads for one process: the host's cores shared by its ranks, at least 1."""
    if requested > 0:
        return requested
    return max(1, cpu_count // local_size)


def available_cpus() -> int:
    return len(os.sched_getaffinity(0))


def configure_threads(threads: int, tf_config=tf.config) -> None:
    # With TF's defaults every rank starts a pool as large as the machine, and
    # several ranks on the same cores then run slower than one.
    try:
        tf_config.threading.set_intra_op_parallelism_threads(threads)
        tf_config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        # TensorFlow already ran in this process (a notebook, an in-process test): its
        # pools are fixed by then. A process horovodrun starts never gets here.
        pass


def is_chief() -> bool:
    """True on the one process that prints, logs and writes checkpoints."""
    return hvd.rank() == 0


def log(message: str) -> None:
    if is_chief():
        print(message, flush=True)


def broadcast_from_chief(value):
    """Rank 0's value on every rank (a small picklable object)."""
    return hvd.broadcast_object(value, root_rank=0, name="chief_value")


def on_chief(fn):
    """Runs fn on rank 0 only; its result, or its UserFacingError, reaches every rank.

    Without this, an error on rank 0 (say, an unwritable model_dir) would leave
    the other ranks waiting in the next collective.
    """
    result, error = None, None
    if is_chief():
        try:
            result = fn()
        except UserFacingError as e:
            error = str(e)
    result, error = broadcast_from_chief((result, error))
    if error is not None:
        raise CollectiveError(error)
    return result


def on_every_rank(fn):
    """Runs fn on every rank; a UserFacingError on any rank stops every rank.

    A rank whose own fn failed reports its own error; the others report the first
    failed rank's, naming it. So a problem one rank alone finds (its host's copy
    of the data, say) is printed by every rank instead of leaving them waiting.
    """
    result, error = None, None
    try:
        result = fn()
    except UserFacingError as e:
        error = str(e)
    errors = hvd.allgather_object(error, name="rank_errors")
    failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
    if failed:
        first_rank, first_error = failed[0]
        raise CollectiveError(error if error is not None else f"rank {first_rank}: {first_error}")
    return result


def leave_together() -> None:
    """Waits, after this rank has printed its error, until every rank has printed its own.

    horovodrun ends the remaining workers as soon as one exits non-zero, so a rank
    that had not yet printed its line would be killed silently. Only for a
    CollectiveError: every rank is then on its way here, none inside another collective.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        hvd.allreduce(tf.constant(0), op=hvd.Sum, name="leave_together")
    except Exception:  # a peer already gone: nothing left to wait for
        pass
