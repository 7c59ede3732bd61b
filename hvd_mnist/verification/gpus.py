"""What to run first on a GPU host: does each rank get a GPU, and do NCCL and a step work?

Four checks, each one line from rank 0, PASS, FAIL or SKIP with its reason:

  gpus       every rank sees a GPU of its own (local rank < the GPUs on its host)
  nccl       Horovod was built with NCCL (HOROVOD_GPU_OPERATIONS=NCCL)
  allreduce  one allreduce of a tensor on each rank's GPU (NCCL's path) gives the sum
  step       one training step of the model on each rank's device leaves every rank
             with the same weights

The decisions are pure functions of every rank's facts (gathered with Horovod), so
they are tested on CPU hosts; on a GPU host this has not run (docs/gpus.md).
"""

import dataclasses
import hashlib
import socket

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
ALLREDUCE_ELEMENTS = 1 << 20  # 4 MiB of float32: large enough for NCCL's ring, not a bandwidth test
STEP_BATCH = 32


@dataclasses.dataclass(frozen=True)
class RankFacts:
    rank: int
    host: str
    local_rank: int
    gpus_on_host: int


@dataclasses.dataclass(frozen=True)
class Outcome:
    check: str
    status: str
    reason: str

    def line(self) -> str:
        return f"{self.status} {self.check}: {self.reason}"


def check_gpus(facts: list) -> Outcome:
    """Every rank has a GPU: its local rank indexes one of its host's GPUs."""
    without = [f for f in facts if f.local_rank >= f.gpus_on_host]
    if not without:
        hosts = sorted({f.host for f in facts})
        return Outcome("gpus", PASS, f"{len(facts)} ranks, one GPU each, on "
                       f"{len(hosts)} host{'s' if len(hosts) > 1 else ''}")
    named = "; ".join(f"rank {f.rank} ({f.host}, local rank {f.local_rank}) sees "
                      f"{f.gpus_on_host} GPU{'' if f.gpus_on_host == 1 else 's'}"
                      for f in without[:4])
    more = f"; and {len(without) - 4} more" if len(without) > 4 else ""
    return Outcome("gpus", FAIL, f"{named}{more}: start at most one process per GPU, and "
                   "check that the driver and CUDA are visible (nvidia-smi)")


def nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE (what hvd.nccl_built() returns) as a version: 23203 -> 2.32.3."""
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def check_nccl(nccl_built: int) -> Outcome:
    """`nccl_built`: hvd.nccl_built(), the NCCL version code built in, 0 without."""
    if nccl_built:
        return Outcome("nccl", PASS, f"Horovod was built with NCCL {nccl_version(nccl_built)}")
    return Outcome("nccl", FAIL, "Horovod was built without NCCL: GPU tensors go through "
                   "the CPU; build it with make setup TF_FLAVOR=gpu (docs/gpus.md)")


def every_rank_has_a_gpu(facts: list) -> bool:
    return all(f.local_rank < f.gpus_on_host for f in facts)


def check_allreduce(summed, size: int, device: str) -> Outcome:
    """`summed` is the allreduce of rank r's tensor filled with r + 1."""
    import numpy as np
    expected = size * (size + 1) / 2
    values = np.asarray(summed)
    if values.size and np.all(values == expected):
        return Outcome("allreduce", PASS, f"{values.size} float32 summed over {size} ranks "
                       f"on {device}")
    wrong = int(np.sum(values != expected))
    return Outcome("allreduce", FAIL, f"{wrong} of {values.size} elements are not the sum "
                   f"{expected:g} over {size} ranks (on {device})")


def check_step(loss: float, digests: list, device: str) -> Outcome:
    """`digests`: every rank's sha256 of its weights after the step."""
    import math
    if not math.isfinite(loss):
        return Outcome("step", FAIL, f"the loss of the step is {loss} on {device}")
    differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    if differing:
        return Outcome("step", FAIL, f"after one step ranks {differing[:8]} hold other "
                       "weights than rank 0")
    return Outcome("step", PASS, f"one step on {device} on {len(digests)} ranks, loss "
                   f"{loss:.4f}, the same weights on every rank")


def weights_digest(variables) -> str:
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()


def run_checks() -> list:
    """The four checks in this process (every rank calls this under horovodrun); the
    outcomes are the same on every rank. The collectives are called by all ranks or by
    none, decided from gathered facts, so a missing GPU on one rank fails a check
    instead of hanging the others."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from hvd_mnist.worker import runtime

    topology = runtime.init_horovod()
    gpus_on_host = len(tf.config.list_physical_devices("GPU"))
    facts = [RankFacts(**fields) for fields in hvd.allgather_object(dataclasses.asdict(
        RankFacts(topology.rank, socket.gethostname(), topology.local_rank, gpus_on_host)))]
    outcomes = [check_gpus(facts), check_nccl(hvd.nccl_built())]
    on_gpus = every_rank_has_a_gpu(facts)
    if on_gpus:
        runtime.configure_gpus(topology.local_rank)
    device = "/GPU:0" if on_gpus else "/CPU:0"
    if on_gpus:
        with tf.device(device):
            mine = tf.fill([ALLREDUCE_ELEMENTS], float(topology.rank + 1))
            # Horovod: a GPU tensor's allreduce runs through NCCL in a NCCL build.
            summed = hvd.allreduce(mine, op=hvd.Sum, name="check_gpus_allreduce")
        placed = tf.DeviceSpec.from_string(summed.device)
        outcomes.append(check_allreduce(summed.numpy(), topology.size,
                                        f"{placed.device_type}:{placed.device_index}"))
    else:
        outcomes.append(Outcome("allreduce", SKIP, "not every rank has a GPU (see gpus)"))
    outcomes.append(one_step(device))
    return outcomes


def one_step(device: str) -> Outcome:
    """One step of the product's own train step on a synthetic batch (each rank its own)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from hvd_mnist.data import mnist
    from hvd_mnist.training import model as model_lib, step as step_lib

    with tf.device(device):
        model = model_lib.build_model()
        optimizer = model_lib.make_optimizer("adam", 0.001)
        # Horovod: every rank starts from rank 0's weights.
        hvd.broadcast_variables(model.variables, root_rank=0)
        train_step = step_lib.make_train_step(model, optimizer, model_lib.make_loss())
        generator = tf.random.Generator.from_seed(hvd.rank())
        images = generator.uniform([STEP_BATCH, *mnist.IMAGE_SHAPE])
        labels = generator.uniform([STEP_BATCH], maxval=mnist.NUM_CLASSES, dtype=tf.int64)
        loss = train_step(images, labels)
    digests = hvd.allgather_object(weights_digest(model.trainable_variables))
    placed = tf.DeviceSpec.from_string(loss.device)
    return check_step(float(loss), digests, f"{placed.device_type}:{placed.device_index}")
