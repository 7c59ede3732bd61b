"""Full-size parity report: the custom loop and Keras fit, default recipe, full MNIST.

    make parity            # -np 2; about 30 minutes on a 2-core machine

Trains both paths one after the other and writes reports/parity.md and
reports/parity.json: per-epoch test loss and accuracy of each, wall time,
images/second, and whether both reach 99.0% within 0.3 points of each other.
Exits non-zero if they don't.
"""

import json
import os
import sys

from absl import app, flags

from tools.bench import launch, machine

FLAGS = flags.FLAGS

MIN_ACCURACY = 0.990
MAX_GAP_POINTS = 0.3
MODES = ("custom", "keras")


def run_both(np_, data_dir, out_dir, timeout_seconds):
    results = {}
    for mode in MODES:
        model_dir = os.path.join(out_dir, mode)
        args = ["-m", "hvd_mnist.main", f"--mode={mode}", f"--data_dir={data_dir}",
                f"--model_dir={model_dir}"]
        command = launch.horovodrun_command(np_, [sys.executable, *args])
        rc, seconds = launch.run_logged(command, os.path.join(out_dir, f"{mode}.log"),
                                        timeout_seconds)
        if rc != 0:
            sys.exit(f"parity: the {mode} run failed ({rc}); see {out_dir}/{mode}.log")
        # As it ran, without this checkout's paths to horovodrun and python.
        shown = [os.path.basename(word) if word in (command[0], sys.executable) else word
                 for word in command]
        results[mode] = {**launch.read_summary(model_dir), "launch_seconds": seconds,
                         "command": " ".join(shown)}
    return results


def verdict(results):
    custom, keras = (results[m]["test_accuracy"] for m in MODES)
    gap_points = 100 * abs(custom - keras)
    passed = min(custom, keras) >= MIN_ACCURACY and gap_points <= MAX_GAP_POINTS
    return {"custom_accuracy": custom, "keras_accuracy": keras, "gap_points": gap_points,
            "passed": passed}


def stack() -> str:
    """TensorFlow's and Keras's versions in this process, as the report names them."""
    from hvd_mnist.worker import keras_compat  # first: it chooses tf.keras
    import tensorflow as tf

    return f"TensorFlow {tf.__version__}, Keras {keras_compat.keras_version()}"


def markdown(results, outcome, np_, machine, when):
    custom, keras = results["custom"], results["keras"]
    lines = [
        "# Parity report: custom loop vs Keras fit",
        "",
        f"Produced by `python -m tools.parity` (`make parity`) on {when}, on {machine}, at -np {np_} "
        f"(Horovod with Gloo, {stack()}), default recipe (Adadelta 1.0 x workers, "
        "128 images per worker, 12 epochs of 60,000 images over all workers).",
        "",
        "| epoch | custom test loss | custom test accuracy | keras test loss "
        "| keras test accuracy |",
        "|---|---|---|---|---|",
    ]
    for c, k in zip(custom["history"], keras["history"]):
        lines.append(f"| {c['epoch']} | {c['test_loss']:.4f} | {100 * c['test_accuracy']:.2f}% "
                     f"| {k['test_loss']:.4f} | {100 * k['test_accuracy']:.2f}% |")
    lines += [
        "",
        "| path | final test accuracy | training s | wall s (launch to exit) | images/s |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        r = results[mode]
        lines.append(f"| {mode} | {100 * r['test_accuracy']:.2f}% | {r['train_seconds']:.0f} | "
                     f"{r['launch_seconds']:.0f} | {r['images_per_second']:.0f} |")
    lines += [
        "",
        f"Difference in final accuracy: {outcome['gap_points']:.2f} percentage points "
        f"(allowed: {MAX_GAP_POINTS}); both at least {100 * MIN_ACCURACY:.1f}%: "
        f"{'yes' if min(outcome['custom_accuracy'], outcome['keras_accuracy']) >= MIN_ACCURACY else 'no'}. "
        f"**{'PASS' if outcome['passed'] else 'FAIL'}**.",
        "",
        f"Accuracy is over all {custom['test_examples']:,} test images (custom loop: sums across "
        "ranks; Keras: each rank's equal share averaged by MetricAverageCallback). Training "
        "time excludes evaluation. Commands:",
        "",
    ]
    lines += [f"    {results[m]['command']}" for m in MODES]
    return "\n".join(lines) + "\n"


def define_flags():
    flags.DEFINE_integer("np", 2, "Horovod workers of each run.", lower_bound=1)
    flags.DEFINE_string("data_dir", "data/tfds", "The prepared mnist (make data).")
    flags.DEFINE_string("out_dir", "runs/parity", "Where the runs and their logs go.")
    flags.DEFINE_string("report_dir", "reports", "Where parity.json and parity.md go.")
    flags.DEFINE_integer("timeout_seconds", 1800, "Per run.", lower_bound=1)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    results = run_both(FLAGS.np, FLAGS.data_dir, FLAGS.out_dir, FLAGS.timeout_seconds)
    outcome = verdict(results)
    os.makedirs(FLAGS.report_dir, exist_ok=True)
    where, when = machine.description(), machine.now()
    with open(os.path.join(FLAGS.report_dir, "parity.json"), "w") as f:
        json.dump({"machine": where, "date": when, "np": FLAGS.np, **outcome,
                   "runs": results}, f, indent=2)
    with open(os.path.join(FLAGS.report_dir, "parity.md"), "w") as f:
        f.write(markdown(results, outcome, FLAGS.np, where, when))
    print(f"parity: custom {100 * outcome['custom_accuracy']:.2f}%, keras "
          f"{100 * outcome['keras_accuracy']:.2f}%, gap {outcome['gap_points']:.2f} points: "
          f"{'PASS' if outcome['passed'] else 'FAIL'} ({FLAGS.report_dir}/parity.md)")
    return 0 if outcome["passed"] else 1


if __name__ == "__main__":
    define_flags()
    app.run(main)
