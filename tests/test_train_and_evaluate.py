"""The custom loop's whole run, in this process: one rank, tiny data, seconds.

The multi-rank behaviour is proven with horovodrun elsewhere; this is the run a
reader can step through in a debugger: `train_and_evaluate(config)` and what it
leaves in model_dir.
"""

import json
import math
import os

import horovod.tensorflow as hvd
import tensorflow as tf

from conftest import TINY_TEST
from tensorboard_events import read_scalars
from hvd_mnist import config as config_lib
from hvd_mnist.training import loop


def test_one_rank_learns_the_tiny_digits_and_leaves_every_file(tiny_data_dir, tmp_path, capsys):
    hvd.init()
    model_dir = tmp_path / "run"
    config = config_lib.TrainConfig(data_dir=tiny_data_dir, model_dir=str(model_dir),
                                    epochs=3, batch_size=32, log_every=5, progress="lines",
                                    threads_per_rank=1)

    summary = loop.train_and_evaluate(config)

    assert (summary["epochs_run"], summary["steps"], summary["num_workers"]) == (3, 45, 1)
    assert all(math.isfinite(r["train_loss"]) for r in summary["history"])
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]
    assert summary["test_accuracy"] >= 0.9 and summary["test_examples"] == TINY_TEST
    assert json.loads((model_dir / "summary.json").read_text()) == json.loads(
        json.dumps(summary))
    assert [start["resumed_after_epoch"] for start in
            json.loads((model_dir / "config.json").read_text())["starts"]] == [None]
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-3")
    assert json.loads((model_dir / "export" / "hvd_mnist_export.json").read_text())[
        "epochs_run"] == 3
    scalars = read_scalars(str(model_dir / "tensorboard"))
    assert [step for step, _ in scalars["epoch/test_accuracy"]] == [1, 2, 3]
    assert [step for step, _ in scalars["train/loss"]] == list(range(5, 46, 5))
    printed = capsys.readouterr().out
    assert "epoch 3/3 step 15/15: loss" in printed and "final test loss" in printed
    assert not os.path.exists(model_dir / "weights")  # no testing aid unless asked for
