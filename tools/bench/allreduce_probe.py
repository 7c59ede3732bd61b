"""Times, on 2+ ranks at once, Horovod's allreduce of exactly the model's gradients: a
grouped allreduce of tensors of their shapes, as float32 and as float16 (Horovod's
Compression.fp16), each started after a barrier so no rank's wait for the other is
counted. Medians of 15 repetitions after 3 warm-ups; rank 0 prints one line
`PROBE {json}`. make scaling and make step-profile run it.

    horovodrun -np 2 -H localhost:2 python -m tools.bench.allreduce_probe
"""

import json
import statistics
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.training import model as model_lib

WARMUP, REPEATS = 3, 15


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
    tf.config.threading.set_intra_op_parallelism_threads(1)  # one thread, as each worker of
    tf.config.threading.set_inter_op_parallelism_threads(1)  # make scaling has
    gradients = [tf.random.normal(v.shape) for v in model_lib.build_model().trainable_variables]
    result = {"gradient_bytes": sum(g.numpy().nbytes for g in gradients)}
    for name, compression in (("fp32", hvd.Compression.none), ("fp16", hvd.Compression.fp16)):
        # The gradients go in as arguments: Horovod names its ops after symbolic tensors.
        allreduce = tf.function(lambda *tensors, c=compression: hvd.grouped_allreduce(
            list(tensors), op=hvd.Average, compression=c))
        result[f"allreduce_{name}_seconds"] = median_seconds(lambda: allreduce(*gradients))
    if hvd.rank() == 0:
        print("PROBE " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
