"""Test-accuracy curve of a learning-rate recipe, every half epoch, in one process.

Used to choose `--recipe=fast`: one process with the global batch computes the
same updates as -np N with global/N per worker (dropout masks aside), so
candidates can be compared without Horovod, one thread each, two at a time.

    python tools/recipe_curve.py --optimizer=adam --peak=0.003 --warmup_epochs=0.2 \
        --epochs=3 --global_batch=128 --data_dir=data/tfds
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from hvd_mnist.data import splits  # noqa: E402  first: it chooses tf.keras
from hvd_mnist.training import model as model_lib  # noqa: E402  first: it chooses tf.keras

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--peak", type=float, required=True, help="global peak learning rate")
    parser.add_argument("--warmup_epochs", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global_batch", type=int, default=128)
    parser.add_argument("--data_dir", default="data/tfds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    train, test = splits.load_split(args.data_dir, "train"), splits.load_split(args.data_dir, "test")
    steps = len(train) // args.global_batch
    tf.keras.utils.set_random_seed(args.seed)
    model = model_lib.build_model()
    schedule = model_lib.WarmupLinearDecay(args.peak, round(args.warmup_epochs * steps),
                                           args.epochs * steps)
    optimizer = model_lib.make_optimizer(args.optimizer, schedule)
    optimizer.build(model.trainable_variables)
    loss_fn = model_lib.make_loss()

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    test_batches = splits.batches_from_indices(test, np.arange(len(test)), 500)

    def accuracy():
        correct = sum(int(tf.reduce_sum(tf.cast(tf.argmax(model(x), 1) == y, tf.int32)))
                      for x, y in test_batches)
        return correct / len(test)

    train_seconds = 0.0
    for epoch in range(1, args.epochs + 1):
        model_lib.reseed_dropout(model, (args.seed, 0, epoch))
        indices = splits.train_epoch_indices(len(train), seed=args.seed, epoch=epoch, steps=steps,
                                           per_rank_batch_size=args.global_batch, rank=0, size=1)
        start = time.perf_counter()
        for i, (images, labels) in enumerate(
                splits.batches_from_indices(train, indices, args.global_batch), start=1):
            step(images, labels)
            if i in (steps // 2, steps):
                train_seconds += time.perf_counter() - start
                print(f"epoch {epoch - 1 + i / steps:.1f}: test accuracy {accuracy():.4f}, "
                      f"{train_seconds:.0f} s training", flush=True)
                start = time.perf_counter()


if __name__ == "__main__":
    main()
