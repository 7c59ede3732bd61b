"""The training flags (docs/usage.md, "Training flags"), grouped by what they configure,
and the `TrainConfig` they make.

The flags only parse; config.py holds every rule their values must keep and states them
in the help: a bad value, or several, is one line naming each (`config.problems`),
before Horovod starts.
"""

from absl import flags

from hvd_mnist import config as config_lib, recipes


def _choice(name, default, help):
    flags.DEFINE_string(name, default, f"{config_lib.allowed(name)}: {help}")


class _UncheckedInteger(flags.IntegerParser):
    """absl's parser, whose help states the range ("a positive integer"), without its check
    of one value at a time: config.py checks every value at once."""

    def is_outside_bounds(self, value):
        return False


class _UncheckedFloat(flags.FloatParser):
    is_outside_bounds = _UncheckedInteger.is_outside_bounds


def _integer(name, default, help):
    flags.DEFINE(_UncheckedInteger(*config_lib.RANGES[name]), name, default, help,
                 serializer=flags.ArgumentSerializer())


def _number(name, default, help):
    flags.DEFINE(_UncheckedFloat(*config_lib.RANGES[name]), name, default, help,
                 serializer=flags.ArgumentSerializer())


def define_flags():
    # Where: the data in, the run's files out.
    flags.DEFINE_string("data_dir", "data/tfds", "TFDS data_dir holding the prepared mnist "
                        "dataset (make data).")
    flags.DEFINE_string("model_dir", "runs/mnist", "Where rank 0 writes checkpoints, "
                        "config.json and summary.json.")

    # What is trained: the recipe, and the flags a recipe sets (recipes.py).
    _choice("recipe", "seed", "seed: Horovod's Keras example (Adadelta 1.0 x workers, 12 "
            "epochs). fast: Adam with warm-up and linear decay, 2 epochs, no dropout "
            "(docs/usage.md). Flags given explicitly override the recipe's values.")
    _integer("epochs", 12, "Passes over the 60,000 training images by all workers together.")
    _integer("batch_size", 128, "Batch size per worker (global batch = this x workers; the "
             "learning rate is scaled by workers).")
    _integer("global_batch_size", 0, "If > 0, the batch over all workers; each worker takes "
             "global/workers and the learning rate is not scaled.")
    _choice("optimizer", "adadelta", "adadelta as in Horovod's Keras example; sgd uses "
            "momentum 0.9.")
    flags.DEFINE_float("learning_rate", None, "Per-worker learning rate (default: " + ", ".join(
        f"{k} {v:g}" for k, v in config_lib.DEFAULT_LEARNING_RATES.items()) + ").")
    _choice("lr_schedule", "constant", "constant, or warmup_linear: linear warm-up over "
            "--warmup_epochs, then linear decay to 0 at the last step.")
    _number("warmup_epochs", 0.0, "Warm-up length for --lr_schedule=warmup_linear.")
    flags.DEFINE_bool("dropout", True, "Use the model's dropout layers (off: no random masks, "
                      "so a run's arithmetic depends on its data alone).")
    _integer("seed", 42, "Seeds weights, dropout and the data order.")
    _integer("backward_passes_per_step", 1, "Local batches whose mean gradient makes one "
             "allreduce and one update (gradient accumulation; an epoch is rounded down to "
             "whole updates).")
    _integer("max_steps_per_epoch", 0, "If > 0, cap each epoch at this many steps (quick "
             "runs).")
    _number("target_accuracy", 0.0, "If > 0, stop after the first epoch whose test accuracy "
            "reaches it (a fraction, e.g. 0.99).")

    # How it runs: the trainer, the input, the numbers and the threads.
    _choice("mode", "custom", "custom: the tf.function loop with DistributedGradientTape; "
            "keras: the model.fit baseline of Horovod's Keras example, on the same batches.")
    flags.DEFINE_bool("keras_literal", False, "With --mode=keras: reproduce Horovod's Keras "
                      "example literally (every worker reads the whole training set, "
                      "epochs = ceil(epochs / workers)).")
    _choice("input", "memory", "memory: each split loaded once, batches gathered by index; "
            "stream: every rank reads the TFDS record files through tf.data each epoch, "
            "shuffled from (seed, epoch), then Dataset.shard(size, rank) (same global batches "
            "at any -np); files: each rank reads only its own record files (needs prepare "
            "--num_shards; results depend on -np). docs/usage.md: Input modes.")
    _integer("shuffle_buffer", 60000, "--input=stream/files: examples in the shuffle buffer "
             "(60000 covers all of MNIST's training split).")
    _choice("precision", "float32", "float32, or mixed_bfloat16 / mixed_float16: the layers "
            "compute in bfloat16 / float16, the variables, the last layer's softmax and the "
            "loss stay float32; mixed_float16 scales the loss dynamically; or float64: model, "
            "data and optimizer in float64, the sharpest check that N workers compute what "
            "one does (verify runs it; slower) (docs/precision.md).")
    flags.DEFINE_bool("fp16_allreduce", False, "Send gradients as float16 (Horovod's "
                      "Compression.fp16): half the bytes on the network.")
    flags.DEFINE_bool("deterministic", False, "Bitwise-repeatable runs: TF op determinism and "
                      "no Horovod tensor fusion (slower; docs/usage.md).")
    _integer("threads_per_rank", 0, "TF threads per process (0: cores / processes on this "
             "host).")

    # What it keeps: checkpoints, resuming, elastic commits, the exported model.
    flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in model_dir.")
    _integer("keep_checkpoints", 3, "How many epoch checkpoints to keep.")
    _integer("checkpoint_every_steps", 0, "If > 0, rank 0 also writes a mid-epoch checkpoint "
             "after every this many steps of the run (the newest is kept, in "
             "model_dir/checkpoints/mid_epoch); --resume continues from the next step.")
    _number("checkpoint_every_minutes", 0.0, "If > 0, also a mid-epoch checkpoint once this "
            "many minutes have passed since the last checkpoint, by rank 0's clock; every "
            "rank takes it after the same step.")
    flags.DEFINE_bool("elastic", False, "Elastic training (docs/elastic.md): run under "
                      "horovodrun --min-np/--max-np --host-discovery-script; workers may leave "
                      "and join, training goes on from the last commit.")
    _integer("commit_every", 20, "With --elastic: steps between commits of model, optimizer "
             "and position to host memory (also at every epoch end).")
    flags.DEFINE_bool("export", True, "At the end, rank 0 writes the model as a SavedModel "
                      "to model_dir/export (for python -m hvd_mnist.predict).")

    # What it shows.
    _choice("progress", "auto", "bar: rank 0 draws a live progress bar; lines: a line every "
            "--log_every steps, no carriage returns (CI, log files); auto: bar when stdout is "
            "a terminal, which under horovodrun it never is (make train decides from its own "
            "terminal).")
    _integer("log_every", 100, "Print the loss every this many steps (0: never).")


def config_from_flags(flag_values) -> config_lib.TrainConfig:
    """The config: flag values, with the recipe's values for flags not given explicitly.
    Raises UserFacingError naming every bad value."""
    values = {name: flag_values[name].value for name in config_lib.TrainConfig.__dataclass_fields__}
    for name, value in recipes.RECIPES.get(values["recipe"], {}).items():
        if not flag_values[name].present:
            values[name] = value
    return config_lib.TrainConfig(**values)
