"""Run first on a GPU host: `horovodrun -np 4 python -m hvd_mnist.check_gpus`.

Rank 0 prints one line per check (hvd_mnist/verification/gpus.py): PASS, FAIL or SKIP
and why; the exit status is 0 only when none failed and none was skipped. On a CPU
host it reports the missing GPUs and still runs one training step on the CPU.
"""

from hvd_mnist.worker import quiet

quiet.before_tensorflow()

from absl import app  # noqa: E402

from hvd_mnist.verification import gpus  # noqa: E402


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    quiet.after_flags()
    from hvd_mnist.worker import runtime
    outcomes = gpus.run_checks()
    for outcome in outcomes:
        runtime.log(outcome.line())
    return 0 if all(outcome.status == gpus.PASS for outcome in outcomes) else 1


def run():
    app.run(main)


if __name__ == "__main__":
    run()
