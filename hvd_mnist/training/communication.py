"""What a step sends over the network, and how often: the two levers for slow links.

`compression`: gradients sent as float16 (`--fp16_allreduce`), half the bytes.
`make_accumulating_train_step`: `--backward_passes_per_step=K`, the mean of K
local batches' gradients, one allreduce and one update every K batches, as
Horovod's DistributedOptimizer(backward_passes_per_step=K,
average_aggregated_gradients=True) does on the Keras path.
"""

import horovod.tensorflow as hvd
import tensorflow as tf


def compression(fp16_allreduce: bool):
    """How gradients cross the network: float32 as they are (in every --precision, see
    precision.py), or float16 with --fp16_allreduce."""
    # Horovod: its compression casts to float16 before the allreduce and back after.
    return hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none


def average_loss(loss, requests=None):
    """The loss averaged over ranks; with `requests` (preemption.StepControl's variable),
    also every rank's requests averaged, in the same allreduce: (loss, agreed).

    Riding on the allreduce every step makes anyway adds no collective and no wait;
    two more numbers in it cost nothing measurable (docs/reliability.md).
    """
    if requests is None:
        # Horovod: the loss averaged over ranks, so every rank takes the same decision on it.
        return hvd.allreduce(loss, op=hvd.Average, name="train_loss")
    both = tf.concat([tf.reshape(loss, [1]), tf.cast(requests, loss.dtype)], axis=0)
    # Horovod: the loss and every rank's requests, averaged in one allreduce.
    averaged = hvd.allreduce(both, op=hvd.Average, name="train_loss")
    return averaged[0], averaged[1:]


def make_accumulating_train_step(model, optimizer, loss_fn, passes: int, compression_,
                                 input_signature, requests=None):
    """K local batches per update: the update is that of one batch K times as large.

    The optimizer's step counter still advances every batch (as Horovod's Keras
    aggregation does), so learning-rate schedules count batches on both paths.
    """
    variables = model.trainable_variables
    accumulated = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]
    batches_seen = tf.Variable(0, dtype=tf.int64, trainable=False)

    def allreduce_and_apply():
        # Horovod: the K batches' mean gradients averaged over ranks, in one grouped allreduce.
        gradients = hvd.grouped_allreduce([a.read_value() for a in accumulated], op=hvd.Average,
                                          compression=compression_)
        optimizer.apply_gradients(zip(gradients, variables))
        for a in accumulated:
            a.assign(tf.zeros_like(a))

    def count_the_batch():
        optimizer.iterations.assign_add(1)

    # Without autograph, as step.make_train_step (its one branch is an explicit tf.cond).
    @tf.function(input_signature=input_signature, autograph=False)
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            probabilities = model(images, training=True)
            loss = loss_fn(labels, probabilities)
        for a, gradient in zip(accumulated, tape.gradient(loss, variables)):
            a.assign_add(gradient / passes)
        batches_seen.assign_add(1)
        tf.cond(batches_seen % passes == 0, allreduce_and_apply, count_the_batch)
        return average_loss(loss, requests)

    return train_step
