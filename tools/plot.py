"""Test accuracy and test loss per epoch of one or more runs, as one PNG.

    make plot                                   # runs/mnist/summary.json -> runs/mnist/plot.png
    python -m tools.plot --out=reports/parity.png reports/parity.json
    python -m tools.plot --out=both.png runs/a/summary.json runs/b/summary.json

make bench also draws, with accuracy_over_time, test accuracy against training seconds of
its time-to-99% runs (reports/bench_time_to_accuracy.png).

Each input is a run's summary.json, or a parity report (reports/parity.json from
`make parity`), which holds the summaries of both of its runs. One line per run,
labelled by training path and number of workers (-np), plus the file name where
two runs would otherwise share a label.
"""

import json
import os
import sys

from absl import app, flags

FLAGS = flags.FLAGS

PATH_NAMES = {"custom": "custom loop", "keras": "Keras fit"}
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "x", "s", "^", "v", "D")


def load_runs(paths):
    """[(label, summary)] from summary.json or parity.json files; exits with one line on
    anything else."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                document = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"plot: error: cannot read {path} ({getattr(e, 'strerror', None) or e})")
        summaries = (list(document["runs"].values()) if "runs" in document else [document])
        for summary in summaries:
            if not summary.get("history"):
                sys.exit(f"plot: error: {path} is not a run's summary.json or a parity report "
                         "(no per-epoch history)")
            label = (f"{PATH_NAMES.get(summary.get('mode'), summary.get('mode', '?'))}, "
                     f"-np {summary.get('num_workers', '?')}")
            runs.append((label, path, summary))
    labels = [label for label, _, _ in runs]
    return [(label if labels.count(label) == 1 else f"{label} ({path})", summary)
            for label, path, summary in runs]


def plot(runs, out_path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    figure, (accuracy_axes, loss_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, (label, summary) in enumerate(runs):
        epochs = [record["epoch"] for record in summary["history"]]
        # Runs that agree exactly (as the parity runs do) would hide each other with one
        # style: each run gets its own dash, marker and width.
        style = {"linestyle": LINE_STYLES[index % len(LINE_STYLES)],
                 "marker": MARKERS[index % len(MARKERS)], "linewidth": 3.5 - 1.5 * (index > 0),
                 "markersize": 8 - 3 * (index > 0), "label": label}
        accuracy_axes.plot(epochs, [100 * r["test_accuracy"] for r in summary["history"]],
                           **style)
        loss_axes.plot(epochs, [r["test_loss"] for r in summary["history"]], **style)
    examples = runs[0][1]["history"][-1].get("test_examples")
    accuracy_axes.set(xlabel="epoch", ylabel=f"test accuracy (%) of {examples:,} images"
                      if examples else "test accuracy (%)", title="test accuracy")
    loss_axes.set(xlabel="epoch", ylabel="test loss (cross-entropy)", title="test loss")
    for axes in (accuracy_axes, loss_axes):
        axes.grid(alpha=0.3)
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    figure.savefig(out_path, dpi=100)
    plt.close(figure)


def accuracy_over_time(curves: dict, out_path: str, title: str, target: float) -> None:
    """Test accuracy after each epoch against the training seconds so far (evaluation
    excluded), one line per run: {label: [(seconds, accuracy)]}; the target as a line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for index, (label, curve) in enumerate(curves.items()):
        axes.plot([seconds for seconds, _ in curve], [100 * accuracy for _, accuracy in curve],
                  linestyle=LINE_STYLES[index % len(LINE_STYLES)],
                  marker=MARKERS[index % len(MARKERS)], label=label)
    axes.axhline(100 * target, color="grey", linewidth=1)
    axes.set(xlabel="training seconds (evaluation excluded)",
             ylabel="test accuracy (%) after each epoch", title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    figure.savefig(out_path, dpi=100)
    plt.close(figure)


def define_flags():
    flags.DEFINE_string("out", "runs/mnist/plot.png", "The PNG to write.")
    flags.DEFINE_string("title", "hvd_mnist: test accuracy and loss per epoch",
                        "The figure's title.")


def main(argv):
    inputs = argv[1:]  # summary.json or parity.json files
    if not inputs:
        raise app.UsageError("plot: name one or more summary.json or parity.json files")
    runs = load_runs(inputs)
    plot(runs, FLAGS.out, FLAGS.title)
    print(f"plot: {len(runs)} run(s) -> {FLAGS.out}")
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
