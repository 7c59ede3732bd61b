"""Times the custom loop's step with and without preemption's requests in its loss allreduce.

`horovodrun -np 2 -H localhost:2 python -m tools.bench.request_probe`: the same model and
optimizer, batch 64 per rank, one thread; 60 alternating blocks of 4 steps of each
(short, so a load that comes and goes hits both alike), each step's results read on the
host. Rank 0 prints one line `REQUESTS {json}`: the median and the range of the blocks'
ms per step (docs/reliability.md)."""

import json
import statistics
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.data import mnist
from hvd_mnist.process import runtime
from hvd_mnist.training import model as model_lib, step as step_lib

BATCH, BLOCKS, STEPS, WARMUP = 64, 60, 4, 5


def main():
    hvd.init()
    runtime.configure_threads(1)
    images = tf.random.uniform([BATCH, *mnist.IMAGE_SHAPE])
    labels = tf.random.uniform([BATCH], maxval=mnist.NUM_CLASSES, dtype=tf.int64)
    model = model_lib.build_model()
    optimizer = model_lib.make_optimizer("adadelta", 1.0)
    optimizer.build(model.trainable_variables)
    requests = tf.Variable([0.0, 0.0], trainable=False)
    plain = step_lib.make_train_step(model, optimizer, model_lib.make_loss())
    carrying = step_lib.make_train_step(model, optimizer, model_lib.make_loss(),
                                        requests=requests)
    steps = {"plain": lambda: float(plain(images, labels)),
             "with_requests": lambda: [t.numpy() for t in carrying(images, labels)]}
    ms_per_step = {name: [] for name in steps}
    for fn in steps.values():
        for _ in range(WARMUP):
            fn()
    for _ in range(BLOCKS):
        for name, fn in steps.items():
            start = time.perf_counter()
            for _ in range(STEPS):
                fn()
            ms_per_step[name].append((time.perf_counter() - start) / STEPS * 1000)
    if runtime.is_chief():
        print("REQUESTS " + json.dumps({
            name: {"median_ms": round(statistics.median(v), 1),
                   "range_ms": [round(min(v), 1), round(max(v), 1)]}
            for name, v in ms_per_step.items()}), flush=True)


if __name__ == "__main__":
    main()
