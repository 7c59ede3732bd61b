"""What make bench measures in its own process, without Horovod: the model's step in
plain TF (the machine's practical limit), an input pipeline with nothing consuming it,
and the seconds a process spends loading the data.

Call use_every_core() before anything here runs a TF op.
"""

import os
import statistics
import subprocess
import sys
import time

from hvd_mnist.outputs.timing import WINDOW_STEPS  # the trainers' window, for plain TF too
from tools.bench import steady_state


def use_every_core() -> None:
    """This process's TF thread pools: one thread per core. TF refuses a change once its
    runtime has started."""
    import tensorflow as tf
    threads = len(os.sched_getaffinity(0))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def plain_tf_images_per_second(batch_size: int, windows: int = 7) -> float:
    """The same model and optimizer in one process, no Horovod, synthetic batches, counted
    in the trainers' windows."""
    from tools.bench import synthetic_step
    step = synthetic_step.build(batch_size).step_function()
    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(WINDOW_STEPS):
            loss, _ = step()
        float(loss)
        rates.append(WINDOW_STEPS * batch_size / (time.perf_counter() - start))
    return steady_state.images_per_second(rates)


def pipeline_images_per_second(data_dir: str, batch_size: int, size: int,
                               mode: str = "memory") -> float:
    """Rank 0's training input for one epoch at `size` ranks, with nothing consuming it."""
    from hvd_mnist.data import inputs
    source = inputs.open_input(mode, data_dir, inputs.Shard(0, size), shuffle_buffer=60_000)
    steps = source.usable_train_examples() // (batch_size * size)
    batches = iter(source.train_batches(seed=0, epoch=1, steps=steps,
                                        per_rank_batch_size=batch_size))
    # Start-up excluded: loading the split (memory) or filling the shuffle buffer (stream,
    # files) happens once per run or per epoch; the rate is the steady state after it.
    next(batches)
    start, images = time.perf_counter(), 0
    for batch_images, _ in batches:
        images += int(batch_images.shape[0])
    return images / (time.perf_counter() - start)


def startup_seconds(data_dir: str, repeats: int = 3) -> dict:
    """Seconds a process spends loading both splits, from the decoded copy (make data) and
    by decoding the TFDS files; and importing tensorflow_datasets, which only the latter
    needs (in a fresh process that has imported TensorFlow already). Medians of repeats."""
    from hvd_mnist.data import splits
    seconds = {"read_decoded_copy": [], "decode_tfds_files": [], "import_tensorflow_datasets": []}
    for _ in range(repeats):
        for name, load in (("read_decoded_copy", splits.load_split),
                           ("decode_tfds_files", splits.decode_split)):
            start = time.perf_counter()
            for split in ("train", "test"):
                load(data_dir, split)
            seconds[name].append(time.perf_counter() - start)
        timed = subprocess.run([sys.executable, "-c", "import time, tensorflow; t = "
                                "time.perf_counter(); import tensorflow_datasets; "
                                "print(time.perf_counter() - t)"],
                               capture_output=True, text=True, check=True)
        seconds["import_tensorflow_datasets"].append(float(timed.stdout.split()[-1]))
    return {name: statistics.median(values) for name, values in seconds.items()}
