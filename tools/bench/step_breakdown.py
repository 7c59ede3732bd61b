"""Where one training step's time goes, per precision: each layer's forward and backward
pass, the loss, and the optimizer's update, timed apart in this process on every core,
no Horovod, a synthetic batch of 128.

Part of make bench's "limit" (limit.py). The step's GFLOP/s over the whole step says how
far it is from the machine's peak; this says why. Each layer runs on an input of the
shape and dtype it sees in the model: forward (training=True, so dropout draws its mask),
then the gradients a training step takes through it (its weights', and its input's for
every layer but the first), driven by a fixed random upstream gradient; the last layer
carries the loss instead. The optimizer (Adadelta, the seed recipe's) applies fixed
gradients to the float32 variables. Each piece timed alone pays its own dispatch, which
the step pays once, so the pieces add up to more than the step.

A float16 step runs without loss scaling here: the scaling multiplies a scalar and the
gradients, and is timed with the optimizer in the trainers.
"""

import time

from tools.bench import flops

BATCH = 128


def seconds_per_call(function, min_seconds: float, min_calls: int = 3) -> float:
    """Wall seconds of one call of a tf.function, after two warm-up calls (tracing)."""
    for _ in range(2):
        _fetch(function())
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        result = function()
        calls += 1
    _fetch(result)
    return (time.perf_counter() - start) / calls


def _fetch(result) -> None:
    """Waits for a call's outputs (eager execution may return before the work is done)."""
    import tensorflow as tf
    for tensor in tf.nest.flatten(result):
        tensor.numpy()


def measure(precision: str, min_seconds: float = 1.0) -> dict:
    """{"step": seconds per batch, "pieces": [{name, seconds, training_flops}], ...}."""
    import tensorflow as tf
    from tools.bench import synthetic_step

    training = synthetic_step.build(BATCH, precision)
    model, optimizer, loss_fn = training.model, training.optimizer, training.loss_fn
    images, labels = training.images, training.labels
    step = training.step_function()

    pieces = []
    layer_input = images
    for index, layer in enumerate(model.layers):
        output = layer(layer_input, training=True)
        is_last = index == len(model.layers) - 1
        pieces.append({"name": flops.describe(layer) + (" and the loss" if is_last else ""),
                       "training_flops": flops.layer_training_flops(layer, first=index == 0),
                       "seconds": seconds_per_call(_layer_pass(
                           layer, layer_input, output, labels if is_last else None, loss_fn,
                           needs_input_gradient=index > 0), min_seconds)})
        layer_input = output

    gradients = [tf.random.normal(v.shape) * 1e-3 for v in training.variables]
    update = tf.function(lambda: optimizer.apply_gradients(
        zip(gradients, model.trainable_variables)))
    pieces.append({"name": "optimizer update (Adadelta)", "training_flops": 0,
                   "seconds": seconds_per_call(update, min_seconds)})
    return {"precision": precision, "batch": BATCH, "step": seconds_per_call(step, min_seconds),
            "pieces": pieces}


def _layer_pass(layer, layer_input, output, labels, loss_fn, needs_input_gradient: bool):
    """A tf.function: the layer's forward and its share of the backward pass."""
    import tensorflow as tf
    weights = layer.trainable_variables
    upstream = tf.random.normal(output.shape, dtype=tf.float32)

    @tf.function
    def layer_pass():
        with tf.GradientTape() as tape:
            tape.watch(layer_input)
            result = layer(layer_input, training=True)
            if labels is not None:
                objective = loss_fn(labels, result)
            else:
                objective = tf.reduce_sum(tf.cast(result, tf.float32) * upstream)
        targets = ([layer_input] if needs_input_gradient else []) + weights
        return tape.gradient(objective, targets) if targets else [objective]
    return layer_pass


def summarise(breakdown: dict, peak_gflops: float) -> dict:
    """Adds each piece's share of the step and GFLOP/s (of the peak), and their sum."""
    step = breakdown["step"]
    breakdown["peak_gflops"] = peak_gflops
    for piece in breakdown["pieces"]:
        piece["share_of_step"] = piece["seconds"] / step
        gflops = BATCH * piece["training_flops"] / piece["seconds"] / 1e9
        piece["gflops"] = gflops if piece["training_flops"] else None
        piece["fraction_of_peak"] = gflops / peak_gflops if piece["training_flops"] else None
    breakdown["pieces_seconds"] = sum(p["seconds"] for p in breakdown["pieces"])
    breakdown["images_per_second"] = BATCH / step
    flop_bearing = [p for p in breakdown["pieces"] if p["training_flops"]]
    breakdown["flop_bearing_share"] = sum(p["seconds"] for p in flop_bearing) / step
    return breakdown
