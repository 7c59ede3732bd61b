"""Entry point: `horovodrun -np 4 python -m hvd_mnist.main [--flags]`.

Kept short on purpose: flags, a frozen config, one call into the library.
Flag values are validated while parsing, before Horovod starts, so a bad value
stops every rank with the flag's name in the message.
"""

import sys

from hvd_mnist.process import quiet

quiet.before_tensorflow()  # no TensorFlow INFO lines; warnings stay

from absl import app, flags  # noqa: E402

from hvd_mnist import config as config_lib, recipes  # noqa: E402
from hvd_mnist.process import keras_compat  # noqa: E402
from hvd_mnist.errors import CollectiveError, UserFacingError  # noqa: E402
from hvd_mnist.outputs import ownership  # noqa: E402
from hvd_mnist.training import preemption  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("data_dir", "data/tfds", "TFDS data_dir holding the prepared mnist "
                        "dataset (make data).")
    flags.DEFINE_string("model_dir", "runs/mnist", "Where rank 0 writes checkpoints, "
                        "config.json and summary.json.")
    flags.DEFINE_enum("mode", "custom", list(config_lib.MODES),
                      "custom: the tf.function loop with DistributedGradientTape; keras: the "
                      "model.fit baseline of Horovod's Keras example, on the same batches.")
    flags.DEFINE_bool("keras_literal", False, "With --mode=keras: reproduce Horovod's Keras "
                      "example literally (every worker reads the whole training set, "
                      "epochs = ceil(epochs / workers)).")
    flags.DEFINE_integer("epochs", 12, "Passes over the 60,000 training images by all "
                         "workers together.", lower_bound=1)
    flags.DEFINE_integer("batch_size", 128, "Batch size per worker (global batch = this x "
                         "workers; the learning rate is scaled by workers).", lower_bound=1)
    flags.DEFINE_integer("global_batch_size", 0, "If > 0, the batch over all workers; each "
                         "worker takes global/workers and the learning rate is not scaled.",
                         lower_bound=0)
    flags.DEFINE_float("learning_rate", None, "Per-worker learning rate (default: "
                       + ", ".join(f"{k} {v:g}" for k, v in
                                   config_lib.DEFAULT_LEARNING_RATES.items()) + ").")
    flags.register_validator("learning_rate", lambda v: v is None or v > 0,
                             message="--learning_rate must be > 0")
    flags.DEFINE_enum("optimizer", "adadelta", list(config_lib.OPTIMIZERS),
                      "adadelta as in Horovod's Keras example; sgd uses momentum 0.9.")
    flags.DEFINE_integer("seed", 42, "Seeds weights, dropout and the data order.",
                         lower_bound=0)
    flags.DEFINE_integer("max_steps_per_epoch", 0, "If > 0, cap each epoch at this many steps "
                         "(quick runs).", lower_bound=0)
    flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in model_dir.")
    flags.DEFINE_integer("log_every", 100, "Print the loss every this many steps (0: never).",
                         lower_bound=0)
    flags.DEFINE_integer("keep_checkpoints", 3, "How many epoch checkpoints to keep.",
                         lower_bound=1)
    flags.DEFINE_bool("dropout", True, "Use the model's dropout layers (off: deterministic "
                      "model, for parity tests).")
    flags.DEFINE_integer("threads_per_rank", 0, "TF threads per process (0: cores / "
                         "processes on this host).", lower_bound=0)
    flags.DEFINE_bool("deterministic", False, "Bitwise-repeatable runs: TF op determinism and "
                      "no Horovod tensor fusion (slower; docs/usage.md).")

    flags.DEFINE_enum("recipe", "seed", list(recipes.RECIPES),
                      "seed: Horovod's Keras example (Adadelta 1.0 x workers, 12 epochs). fast: "
                      "Adam with warm-up and linear decay, 2 epochs, no dropout (docs/usage.md). "
                      "Flags given explicitly override the recipe's values.")
    flags.DEFINE_enum("lr_schedule", "constant", list(config_lib.LR_SCHEDULES),
                      "constant, or warmup_linear: linear warm-up over --warmup_epochs, then "
                      "linear decay to 0 at the last step.")
    flags.DEFINE_float("warmup_epochs", 0.0, "Warm-up length for --lr_schedule=warmup_linear.",
                       lower_bound=0.0)
    flags.DEFINE_float("target_accuracy", 0.0, "If > 0, stop after the first epoch whose test "
                       "accuracy reaches it (a fraction, e.g. 0.99).", lower_bound=0.0,
                       upper_bound=1.0)
    flags.DEFINE_enum("input", "memory", list(config_lib.INPUTS),
                      "memory: each split loaded once, batches gathered by index; stream: "
                      "every rank reads the TFDS record files through tf.data each epoch, "
                      "shuffled from (seed, epoch), then Dataset.shard(size, rank) (same global "
                      "batches at any -np); files: each rank reads only its own record files "
                      "(needs prepare --num_shards; results depend on -np). docs/usage.md: "
                      "Input modes.")
    flags.DEFINE_integer("shuffle_buffer", 60000, "--input=stream/files: examples in the "
                         "shuffle buffer (60000 covers all of MNIST's training split).",
                         lower_bound=1)
    flags.register_multi_flags_validator(
        ["keras_literal", "input"], lambda f: not f["keras_literal"] or f["input"] == "memory",
        message="--keras_literal needs --input=memory")
    flags.DEFINE_bool("elastic", False, "Elastic training (docs/elastic.md): run under "
                      "horovodrun --min-np/--max-np --host-discovery-script; workers may leave "
                      "and join, training goes on from the last commit.")
    flags.DEFINE_integer("commit_every", 20, "With --elastic: steps between commits of model, "
                         "optimizer and position to host memory (also at every epoch end).",
                         lower_bound=1)
    flags.register_multi_flags_validator(
        ["mode", "elastic"], lambda f: f["mode"] == "custom" or not f["elastic"],
        message="--elastic is supported by --mode=custom only")
    flags.DEFINE_enum("progress", "auto", list(config_lib.PROGRESS_MODES),
                      "bar: rank 0 draws a live progress bar; lines: a line every --log_every "
                      "steps, no carriage returns (CI, log files); auto: bar when stdout is a "
                      "terminal, which under horovodrun it never is (make train decides from "
                      "its own terminal).")
    flags.DEFINE_bool("export", True, "At the end, rank 0 writes the model as a SavedModel "
                      "to model_dir/export (for python -m hvd_mnist.predict).")
    flags.DEFINE_bool("fp16_allreduce", False, "Send gradients as float16 (Horovod's "
                      "Compression.fp16): half the bytes on the network.")
    flags.DEFINE_enum("precision", "float32", list(config_lib.PRECISIONS),
                      "float32, or mixed_bfloat16 / mixed_float16: the layers compute in "
                      "bfloat16 / float16, the variables, the last layer's softmax and the "
                      "loss stay float32; mixed_float16 scales the loss dynamically; or "
                      "float64: model, data and optimizer in float64, the sharpest check "
                      "that N workers compute what one does (verify runs it; slower) "
                      "(docs/precision.md).")
    flags.DEFINE_integer("backward_passes_per_step", 1, "Local batches whose mean gradient "
                         "makes one allreduce and one update (gradient accumulation; an epoch "
                         "is rounded down to whole updates).", lower_bound=1)
    flags.register_multi_flags_validator(
        ["precision", "backward_passes_per_step"],
        lambda f: f["precision"] != "mixed_float16" or f["backward_passes_per_step"] == 1,
        message="--precision=mixed_float16 needs --backward_passes_per_step=1: the loss scale "
                "decides per update whether to skip it, not per accumulated batch")
    flags.register_multi_flags_validator(
        ["mode", "keras_literal"], lambda f: f["mode"] == "keras" or not f["keras_literal"],
        message="--keras_literal needs --mode=keras")
    flags.register_multi_flags_validator(
        ["mode", "resume"], lambda f: f["mode"] == "custom" or not f["resume"],
        message="--resume is supported by --mode=custom only")
    flags.DEFINE_integer("checkpoint_every_steps", 0, "If > 0, rank 0 also writes a mid-epoch "
                         "checkpoint after every this many steps of the run (the newest is kept, "
                         "in model_dir/checkpoints/mid_epoch); --resume continues from the next "
                         "step.", lower_bound=0)
    flags.DEFINE_float("checkpoint_every_minutes", 0.0, "If > 0, also a mid-epoch checkpoint "
                       "once this many minutes have passed since the last checkpoint, by rank "
                       "0's clock; every rank takes it after the same step.", lower_bound=0.0)
    for name in ("checkpoint_every_steps", "checkpoint_every_minutes"):
        flags.register_multi_flags_validator(
            [name, "mode"], lambda f, name=name: not f[name] or f["mode"] == "custom",
            message=f"--{name} needs --mode=custom: the Keras path cannot --resume")
        flags.register_multi_flags_validator(
            [name, "elastic"], lambda f, name=name: not f[name] or not f["elastic"],
            message=f"--{name} is not for --elastic, which commits its state to memory "
                    "every --commit_every steps instead")
    flags.register_multi_flags_validator(
        ["checkpoint_every_steps", "backward_passes_per_step"],
        lambda f: f["checkpoint_every_steps"] % f["backward_passes_per_step"] == 0,
        message="--checkpoint_every_steps must be a multiple of --backward_passes_per_step: "
                "a checkpoint holds no half-accumulated gradient")

def config_from_flags(flag_values) -> config_lib.TrainConfig:
    """The config: flag values, with the recipe's values for flags not given explicitly."""
    values = {name: flag_values[name].value for name in config_lib.TrainConfig.__dataclass_fields__}
    for name, value in recipes.RECIPES[values["recipe"]].items():
        if not flag_values[name].present:
            values[name] = value
    return config_lib.TrainConfig(**values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = config_from_flags(FLAGS)
    quiet.after_flags()
    try:
        keras_compat.check_keras()
        from hvd_mnist.data import splits
        from hvd_mnist.training import keras_fit, loop
        splits.check_prepared(config.data_dir)  # before Horovod does any work
        trainer = loop if config.mode == "custom" else keras_fit
        if config.elastic:
            from hvd_mnist.training import elastic as trainer
        trainer.train_and_evaluate(config)
    except preemption.Stopped as e:  # raised by every rank after the same step
        print(f"hvd_mnist: {e}", file=sys.stderr, flush=True)
        ownership.release(config.model_dir)
        from hvd_mnist.process import runtime
        runtime.leave_together()
        preemption.exit_at_once()
    except UserFacingError as e:
        print(f"hvd_mnist: error: {e}", file=sys.stderr, flush=True)
        # Before any rank exits: horovodrun then ends the others, and a rank 0 ended so
        # would leave its name in model_dir as a run that died.
        ownership.release(config.model_dir)
        if isinstance(e, CollectiveError):  # found after Horovod started, by every rank
            from hvd_mnist.process import runtime
            runtime.leave_together()
        return 1
    return 0


def run():
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
