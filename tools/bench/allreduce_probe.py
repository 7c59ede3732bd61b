"""Times, on 2+ ranks at once, the parts of a training step the scaling model needs.

compute: one step of the custom loop's model without Horovod (forward, backward,
apply), batch 128, one thread. allreduce: hvd.grouped_allreduce of exactly the
model's gradients, as float32 and as float16 (Horovod's Compression.fp16), each
started after a barrier so no rank's wait for the other is counted. Medians of
15 repetitions after 3 warm-ups; rank 0 prints one line `PROBE {json}`.
"""

import json
import statistics
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.process import runtime
from tools.bench import synthetic_step

BATCH, WARMUP, REPEATS = 128, 3, 15


def median_seconds(fn) -> float:
    barrier = lambda: hvd.allreduce(tf.constant(0.0), name="probe_barrier").numpy()  # noqa: E731
    seconds = []
    for repeat in range(WARMUP + REPEATS):
        barrier()
        start = time.perf_counter()
        [t.numpy() for t in fn()]
        if repeat >= WARMUP:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main():
    hvd.init()
    runtime.configure_threads(1)
    training = synthetic_step.build(BATCH)
    step = training.step_function()

    def local_step():
        return step()[1]

    gradients = local_step()
    result = {"gradient_bytes": sum(g.numpy().nbytes for g in gradients),
              "compute_seconds": median_seconds(local_step)}
    for name, compression in (("fp32", hvd.Compression.none), ("fp16", hvd.Compression.fp16)):
        # The gradients go in as arguments: Horovod names its ops after symbolic tensors.
        allreduce = tf.function(lambda *tensors, c=compression: hvd.grouped_allreduce(
            list(tensors), op=hvd.Average, compression=c))
        result[f"allreduce_{name}_seconds"] = median_seconds(lambda: allreduce(*gradients))
    if hvd.rank() == 0:
        print("PROBE " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
