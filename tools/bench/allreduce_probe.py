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
from hvd_mnist.training import model as model_lib

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
    model = model_lib.build_model(dropout=True)
    loss_fn, optimizer = model_lib.make_loss(), model_lib.make_optimizer("adadelta", 1.0)
    images = tf.random.uniform([BATCH, *model_lib.INPUT_SHAPE])
    labels = tf.random.uniform([BATCH], 0, 10, tf.int64)

    @tf.function
    def local_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return gradients

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
