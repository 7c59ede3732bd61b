"""hvd_mnist's training step taken apart in TensorFlow, one process, one thread, synthetic
batches: the TensorFlow half of step_profile.py, which runs it and prints it beside PyTorch's.

    python -m tools.bench.step_profile_tf [--min_seconds=1]     (prints one JSON line)

The model and optimizer are the trainers' (training/model.py: Adam, as in the job make bench
sets beside PyTorch's). Each piece is its own tf.function, timed alone after two warm-up
calls (step_breakdown.seconds_per_call): every layer's forward (training=True, so dropout
draws its mask), its forward and backward together (the backward is their difference), the
Adam update of fixed gradients, and the whole step. Then TensorFlow's profiler over
PROFILED_STEPS whole steps: each op's time, from the trace's XPlane.
"""

import argparse
import collections
import glob
import json
import os
import tempfile
import time

import tensorflow as tf

from hvd_mnist.process import runtime
from tools.bench import step_breakdown

BATCH = 128
PROFILED_STEPS = 10
PIECES = ("Conv2D(32)", "Conv2D(64)", "MaxPooling2D", "Dropout(0.25)", "Flatten", "Dense(128)",
          "Dropout(0.5)", "Dense(10) and the loss")


def build(seed: int = 0):
    from hvd_mnist.data import mnist
    from hvd_mnist.training import model as model_lib
    tf.keras.utils.set_random_seed(seed)
    model = model_lib.build_model()
    optimizer = model_lib.make_optimizer("adam", 0.001)
    optimizer.build(model.trainable_variables)
    images = tf.random.uniform([BATCH, *mnist.IMAGE_SHAPE])
    labels = tf.random.uniform([BATCH], maxval=mnist.NUM_CLASSES, dtype=tf.int64)
    return model, optimizer, model_lib.make_loss(), images, labels


def op_profile(step, steps: int) -> list:
    """[{op, ms_per_step}] of `steps` calls of `step`, from TensorFlow's profiler: the
    events of TF's compute threads, named scope/op:kernel, summed per name."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            step_breakdown._fetch(step())
        tf.profiler.experimental.stop()
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
        space = xplane_pb2.XSpace()
        with open(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0],
                  "rb") as f:
            space.ParseFromString(f.read())
    totals = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name.replace("::", ""):  # scope/op:kernel, not the executor's own
                    totals[name] += event.duration_ps / 1e9 / steps
    return [{"op": op, "ms_per_step": ms} for op, ms in totals.most_common()]


def measure(min_seconds: float) -> dict:
    model, optimizer, loss_fn, images, labels = build()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    pieces, layer_input = [], images
    for index, (name, layer) in enumerate(zip(PIECES, model.layers)):
        output = layer(layer_input, training=True)
        is_last = index == len(model.layers) - 1
        forward = tf.function(lambda layer=layer, x=layer_input: layer(x, training=True))
        both = step_breakdown._layer_pass(layer, layer_input, output, labels if is_last else None,
                                          loss_fn, needs_input_gradient=index > 0)
        forward_seconds = step_breakdown.seconds_per_call(forward, min_seconds)
        pieces.append({"name": name, "forward_ms": 1e3 * forward_seconds,
                       "backward_ms": 1e3 * (step_breakdown.seconds_per_call(both, min_seconds)
                                             - forward_seconds)})
        layer_input = output
    gradients = [tf.random.normal(v.shape) * 1e-3 for v in model.trainable_variables]
    update = tf.function(lambda: optimizer.apply_gradients(
        zip(gradients, model.trainable_variables)))
    return {"framework": f"TensorFlow {tf.__version__}", "threads": 1, "batch": BATCH,
            "pieces": pieces,
            "optimizer_ms": 1e3 * step_breakdown.seconds_per_call(update, min_seconds),
            "step_ms": 1e3 * step_breakdown.seconds_per_call(step, min_seconds),
            "profiled_steps": PROFILED_STEPS, "ops": op_profile(step, PROFILED_STEPS)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min_seconds", type=float, default=1.0,
                        help="Each piece is called for at least this long.")
    runtime.configure_threads(1)  # before the first op fixes TF's pools
    started = time.perf_counter()
    result = measure(parser.parse_args().min_seconds)
    result["seconds"] = time.perf_counter() - started
    print("PROFILE " + json.dumps(result), flush=True)
