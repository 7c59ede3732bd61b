"""Horovod's own TF2 MNIST example, as a user would otherwise run it: the baseline of make bench.

examples/tensorflow2/tensorflow2_mnist.py of horovod/horovod (v0.28.1; unchanged on its
master since), line for line but for:
- the data: the example's `tf.keras.datasets.mnist.load_data()` downloads Keras's
  mnist.npz; here the same arrays come from the IDX .gz files `make data` writes
  (data/cache/idx), read as quickly (both are gzip-compressed uint8 arrays);
- `--steps` (the example's 10000 // size), so that the bench can ask for the images of an
  hvd_mnist run, and `--out_dir` for the checkpoint (not ./checkpoints);
- instrumentation: the time of every finished step and of the loop's end (when the
  dataset's iterator has been deleted), and at exit, from every rank, a JSON file with them
  and the process's peak RSS (`--out_dir/rank<R>.json`);
- on Keras 3 the optimizer's `variables` is a list, not a method (Horovod takes Keras 3's
  variables with tools/horovod-patches/keras3-variables.patch; horovod#4290).

    horovodrun -np 2 -H localhost:2 python -m tools.bench.horovod_example --steps=160 --out_dir=DIR
"""

import json
import os
import resource
import time

import tensorflow as tf

import horovod.tensorflow as hvd
from absl import app, flags

from hvd_mnist.data import idx  # the IDX reader, for the data-loading line only


def load_data(idx_dir):
    """(train images, labels), (test images, labels) as load_data() returns them."""
    def pair(split):
        return idx.read_pair(os.path.join(idx_dir, idx.FILENAMES[f"{split}_data"]),
                             os.path.join(idx_dir, idx.FILENAMES[f"{split}_labels"]))
    return pair("train"), pair("test")


def main(argv):
    args = flags.FLAGS
    os.makedirs(args.out_dir, exist_ok=True)  # (instrumentation)

    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    (mnist_images, mnist_labels), _ = load_data(args.idx_dir)

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
                 tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000).batch(128)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    checkpoint_dir = os.path.join(args.out_dir, 'checkpoints')
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes,
        # after the first gradient step to ensure optimizer initialization.
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            opt_variables = opt.variables() if callable(opt.variables) else opt.variables
            hvd.broadcast_variables(opt_variables, root_rank=0)

        return loss_value

    step_unix_times = []
    for batch, (images, labels) in enumerate(dataset.take(args.steps)):
        loss_value = training_step(images, labels, batch == 0)
        step_unix_times.append(time.time())  # the call returns once the step ran (CPU)

        if batch % 10 == 0 and hvd.rank() == 0:
            print('Step #%d\tLoss: %.6f' % (batch, loss_value))
    loop_end_unix_time = time.time()  # after the dataset's iterator was deleted

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting it.
    if hvd.rank() == 0:
        checkpoint.save(checkpoint_dir)

    with open(os.path.join(args.out_dir, f'rank{hvd.rank()}.json'), 'w') as f:
        json.dump({'rank': hvd.rank(), 'size': hvd.size(), 'step_unix_times': step_unix_times,
                   'loop_end_unix_time': loop_end_unix_time,
                   'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024},
                  f)


if __name__ == '__main__':
    flags.DEFINE_string('idx_dir', 'data/cache/idx', 'The IDX .gz files make data writes.')
    flags.DEFINE_integer('steps', None, 'Steps per worker.', lower_bound=1)
    flags.DEFINE_string('out_dir', None, 'Where the checkpoint and rank<R>.json go.')
    flags.mark_flags_as_required(['steps', 'out_dir'])
    app.run(main)
