"""The training step's levers, each measured against the step hvd_mnist uses, in the same job.

Every rank builds one model and optimizer per variant and the variants take turns:
WINDOWS rounds, each round WINDOW_STEPS steps of every variant in turn on the same
synthetic batch, so a change of machine load hits all of them alike. Images/s over all
ranks; median of the rounds after the first (tracing and warm-up).

  hvd_mnist          step_lib.make_train_step: the loss averaged by an allreduce of its own
  loss_on_gradients  the loss averaged inside the gradients' allreduce instead (a probe)
  local_loss         no averaged loss at all: the floor for what averaging it can cost
  static_batch       the batch dimension fixed in the step's signature
  keras_dropout      Keras's default dropout instead of the seeded generators
  autograph          traced with autograph on, as hvd_mnist's step was before (its first
                     call holds the tracing)

    horovodrun -np 2 -H localhost:2 python -m tools.bench.step_levers [--windows=10]
"""

import json
import time

import horovod.tensorflow as hvd
import tensorflow as tf
from absl import app, flags

from hvd_mnist.data import mnist
from hvd_mnist.process import keras_compat, runtime
from hvd_mnist.training import model as model_lib, step as step_lib
from hvd_mnist.outputs.timing import WINDOW_STEPS
from tools.bench import steady_state

FLAGS = flags.FLAGS


def alternative_step(model, optimizer, loss_fn, loss_average="allreduce", autograph=False):
    """step_lib.make_train_step with one thing changed. loss_average: "allreduce" (as there),
    "gradients" (the loss as the gradient of loss + probe * stop_gradient(loss) with
    respect to a zero probe variable, so it is averaged in the gradients' allreduce), or
    "none" (each rank's own loss)."""
    probe = tf.Variable(0.0, name="loss_probe")
    weights = model.trainable_variables
    sources = [*weights, probe]

    @tf.function(input_signature=[step_lib.image_spec(model), step_lib.LABEL_SPEC],
                 autograph=autograph)
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
            probed_loss = loss + probe * tf.stop_gradient(loss)
        tape = hvd.DistributedGradientTape(tape)
        if loss_average == "gradients":
            *gradients, mean_loss = tape.gradient(probed_loss, sources)
        else:
            gradients = tape.gradient(loss, weights)
            mean_loss = (hvd.allreduce(loss, op=hvd.Average, name="train_loss")
                         if loss_average == "allreduce" else loss)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return mean_loss
    return step


def variants(batch_size):
    static_signature = [tf.TensorSpec([batch_size, *mnist.IMAGE_SHAPE], tf.float32),
                        step_lib.LABEL_SPEC]
    return {
        "hvd_mnist": step_lib.make_train_step,
        "loss_on_gradients": lambda m, o, l: alternative_step(m, o, l, "gradients"),
        "local_loss": lambda m, o, l: alternative_step(m, o, l, "none"),
        "static_batch": lambda m, o, l: step_lib.make_train_step(
            m, o, l, input_signature=static_signature),
        "keras_dropout": step_lib.make_train_step,
        "autograph": lambda m, o, l: alternative_step(m, o, l, autograph=True),
    }


def build(name, make_step, seed):
    tf.keras.utils.set_random_seed(seed)
    model = (keras_default_dropout_model() if name == "keras_dropout"
             else model_lib.build_model())
    optimizer = model_lib.make_optimizer("adam", 0.001 * hvd.size())
    optimizer.build(model.trainable_variables)
    hvd.broadcast_variables(keras_compat.state_variables(model, optimizer), root_rank=0)
    return make_step(model, optimizer, model_lib.make_loss())


def keras_default_dropout_model():
    """build_model's network with Keras's default Dropout (legacy stateful random ops)."""
    seeded = model_lib.build_model()
    layers = [tf.keras.Input(shape=mnist.IMAGE_SHAPE)]
    for layer in seeded.layers:
        config = layer.get_config()
        if isinstance(layer, tf.keras.layers.Dropout):
            config.pop("rng_type", None)
        layers.append(type(layer).from_config(config))
    return tf.keras.Sequential(layers)


def define_flags():
    flags.DEFINE_integer("batch_size", 128, "Images per rank per step.", lower_bound=1)
    flags.DEFINE_integer("windows", 10, "Rounds of WINDOW_STEPS steps of every variant; the "
                         "first is dropped.", lower_bound=2)
    flags.DEFINE_integer("threads_per_rank", 0, "TF threads per rank (0: cores / local "
                         "ranks, as hvd_mnist).", lower_bound=0)
    flags.DEFINE_list("only", [], "The variants to measure (default: all).")
    flags.DEFINE_string("report", "", "A JSON file for rank 0's result.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    args = FLAGS
    topology = runtime.init_horovod()
    threads = runtime.threads_per_rank(args.threads_per_rank, topology.local_size,
                                       runtime.available_cpus())
    runtime.configure_threads(threads)
    images = tf.random.stateless_uniform([args.batch_size, *mnist.IMAGE_SHAPE], (1, hvd.rank()))
    labels = tf.random.stateless_uniform([args.batch_size], (2, hvd.rank()), maxval=10,
                                         dtype=tf.int64)
    steps, first_call_seconds = {}, {}
    chosen = variants(args.batch_size)
    if args.only:
        unknown = set(args.only) - set(chosen)
        if unknown:
            raise app.UsageError(f"--only: no variant {', '.join(sorted(unknown))} "
                                 f"(variants: {', '.join(chosen)})")
        chosen = {n: chosen[n] for n in args.only}
    for name, make_step in chosen.items():
        steps[name] = build(name, make_step, seed=1)
        start = time.perf_counter()
        float(steps[name](images, labels))
        first_call_seconds[name] = time.perf_counter() - start
    rates = {name: [] for name in steps}
    for _ in range(args.windows):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(WINDOW_STEPS):
                loss = step(images, labels)
            float(loss)
            rates[name].append(WINDOW_STEPS * args.batch_size * hvd.size()
                               / (time.perf_counter() - start))
    result = {"np": hvd.size(), "threads_per_rank": threads, "batch_size": args.batch_size,
              "first_call_seconds": first_call_seconds,
              "images_per_second": {n: steady_state.images_per_second(r)
                                    for n, r in rates.items()},
              "window_images_per_second": rates}
    base = result["images_per_second"]["hvd_mnist"]
    result["over_hvd_mnist"] = {n: r / base for n, r in result["images_per_second"].items()}
    if runtime.is_chief():
        for name in steps:
            print(f"{name:15s} {result['images_per_second'][name]:7.0f} images/s "
                  f"({result['over_hvd_mnist'][name]:.3f}x)  first call "
                  f"{first_call_seconds[name]:.2f} s", flush=True)
        if args.report:
            with open(args.report, "w") as f:
                json.dump(result, f, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
