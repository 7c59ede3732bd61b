"""The baseline `make bench` compares hvd_mnist with: Horovod's example, as
tools/bench/horovod_example.py runs it, and the arithmetic both sides' figures go through."""

import json
import os

import pytest

from conftest import horovodrun
from tools.bench import launch, versus_example


def test_windows_are_counted_as_hvd_mnist_counts_them():
    # 41 steps 0.1 s apart, 256 images each: two whole 20-step windows of 2560 images/s.
    times = [100 + 0.1 * i for i in range(41)]
    assert versus_example.windows_from_step_times(times, 256) == pytest.approx([2560, 2560])
    assert versus_example.steady_images_per_second([900, 2000, 2100, 2050]) == 2050


def test_horovods_example_trains_on_the_prepared_data_and_reports_every_rank(tiny_data_dir,
                                                                            tmp_path):
    idx_dir = os.path.join(os.path.dirname(tiny_data_dir), "idx")  # written by conftest
    result = horovodrun(2, launch.python_module("tools.bench.horovod_example",
                                                f"--idx_dir={idx_dir}", "--steps=21",
                                                f"--out_dir={tmp_path}"),
                        cwd=launch.REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[0]<stdout>:Step #20\tLoss: " in result.stdout
    assert "[1]<stdout>:Step" not in result.stdout  # only rank 0 prints, as upstream
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["size"] == 2 and len(report["step_unix_times"]) == 21
        assert report["peak_rss_mib"] > 100
    assert list(tmp_path.glob("checkpoints-1.index"))  # rank 0's checkpoint at the end
