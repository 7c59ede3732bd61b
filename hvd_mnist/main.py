"""Entry point: `horovodrun -np 4 python -m hvd_mnist.main [--flags]`.

Kept short on purpose: the flags (train_flags.py), a frozen config built from them
(config.py, which checks every value before Horovod starts and names every bad one in
one line), then one call into the library: the trainer's train_and_evaluate.
"""

import sys

from hvd_mnist.worker import quiet

quiet.before_tensorflow()  # no TensorFlow INFO lines; warnings stay

from absl import app, flags  # noqa: E402

from hvd_mnist import train_flags  # noqa: E402
from hvd_mnist.errors import CollectiveError, UserFacingError  # noqa: E402
from hvd_mnist.outputs import ownership  # noqa: E402
from hvd_mnist.training import preemption  # noqa: E402
from hvd_mnist.worker import garbage_collector, keras_compat  # noqa: E402


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = train_flags.config_from_flags(flags.FLAGS)
    except UserFacingError as e:
        return failed(e)
    quiet.after_flags()
    try:
        keras_compat.check_keras()
        from hvd_mnist.data import splits
        from hvd_mnist.training import keras_fit, loop
        splits.check_prepared(config.data_dir)  # before Horovod does any work
        trainer = loop if config.mode == "custom" else keras_fit
        if config.elastic:
            from hvd_mnist.training import elastic as trainer
        garbage_collector.freeze_loaded()  # TensorFlow, Horovod and the trainer are loaded
        trainer.train_and_evaluate(config)
    except preemption.Stopped as e:  # raised by every rank after the same step
        print(f"hvd_mnist: {e}", file=sys.stderr, flush=True)
        ownership.release(config.model_dir)
        from hvd_mnist.worker import runtime
        runtime.leave_together()
        preemption.exit_at_once()
    except UserFacingError as e:
        return failed(e, config.model_dir)
    return 0


def failed(error: UserFacingError, model_dir: str = "") -> int:
    """Prints the error's one line; returns the exit status."""
    print(f"hvd_mnist: error: {error}", file=sys.stderr, flush=True)
    if model_dir:
        # Before any rank exits: horovodrun then ends the others, and a rank 0 ended so
        # would leave its name in model_dir as a run that died.
        ownership.release(model_dir)
    if isinstance(error, CollectiveError):  # found after Horovod started, by every rank
        from hvd_mnist.worker import runtime
        runtime.leave_together()
    return 1


def run():
    garbage_collector.pause()  # until main() has loaded TensorFlow (garbage_collector.py)
    train_flags.define_flags()
    flags.adopt_module_key_flags(train_flags)  # --help lists them as this command's
    app.run(main)


if __name__ == "__main__":
    run()
