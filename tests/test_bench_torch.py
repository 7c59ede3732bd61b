"""What make bench sets hvd_mnist beside: the same job in PyTorch DDP (tools/bench/torch_ddp.py),
reading the same prepared data in the same order, and how the bench reads and reports its runs
(versus.py).

Only the job itself needs PyTorch: its test runs when the venv make torch-venv (or make bench)
makes is there, and skips, naming it, when not; make test never makes it.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from hvd_mnist.data import splits
from hvd_mnist.errors import DataError
from tools.bench import launch, tables, versus

needs_torch_venv = pytest.mark.skipif(
    not os.path.exists(launch.TORCH_PYTHON),
    reason=f"no PyTorch venv ({launch.TORCH_PYTHON}; make torch-venv makes it)")


def test_the_pytorch_job_reads_the_same_examples_as_hvd_mnist(tiny_data_dir, tmp_path):
    arrays_dir = versus.write_arrays(tiny_data_dir, str(tmp_path))
    for split in splits.SPLITS:
        expected = splits.load_split(tiny_data_dir, split)
        for what, array in (("images", expected.images), ("labels", expected.labels)):
            # As torch_ddp.load_split reads them: .npy, no pickle.
            read = np.load(os.path.join(arrays_dir, f"{split}-{what}.npy"), allow_pickle=False)
            assert read.dtype == array.dtype and np.array_equal(read, array)


def test_a_damaged_copy_stops_the_bench_before_the_pytorch_job_naming_the_file(
        tiny_data_dir, tmp_path):
    data_dir = tmp_path / "tfds"
    shutil.copytree(tiny_data_dir, data_dir)
    labels = pathlib.Path(splits.decoded_dir(str(data_dir))) / "test-labels.tensor"
    labels.write_bytes(labels.read_bytes()[:-1] + b"\xff")
    with pytest.raises(DataError, match=f"{labels} is damaged"):
        versus.write_arrays(str(data_dir), str(tmp_path / "bench"))


def test_without_the_pytorch_venv_the_bench_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "TORCH_PYTHON", str(tmp_path / "bin" / "python"))
    with pytest.raises(SystemExit, match="no PyTorch venv .*; make torch-venv makes it"):
        launch.torch_python()


def test_the_pytorch_job_orders_the_examples_without_tensorflow():
    # torch_ddp.py takes each rank's examples from hvd_mnist's own order module.
    code = "import sys, hvd_mnist.data.order; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=launch.REPO_ROOT)


def test_the_pytorch_runs_result_is_the_line_rank_0_prints():
    summary = {"test_accuracy": 0.95, "images_per_second": 1200.0,
               "peak_rss_mib_per_rank": [540.5, 530.0], "launch_to_first_step_seconds": 4.5,
               "timing": {"first_step_unix_time": 1000.0, "last_step_unix_time": 1013.0}}
    output = ("W1204 torchrun warning\n" + versus.RESULT_PREFIX + json.dumps(summary)
              + "\nother line\n")
    assert versus.parse_result(output) == summary
    # The largest rank's memory; the wall's end is what is left after the start and the
    # steps: 20 - 4.5 - 13, the job having been launched 4.5 s before its first step.
    assert versus.figures(summary, launch_unix=995.5, wall_seconds=20.0) == {
        "wall_seconds": 20.0, "images_per_second": 1200.0,
        "launch_to_first_step_seconds": 4.5, "last_step_to_exit_seconds": 2.5,
        "peak_rss_mib": 540.5, "test_accuracy": 0.95}


def test_a_pytorch_run_without_its_line_stops_the_bench():
    with pytest.raises(SystemExit, match="no line starting with 'torch_ddp result: '"):
        versus.parse_result("Traceback (most recent call last):\n")


def test_the_pytorch_job_runs_under_the_pytorch_venvs_torchrun():
    command = versus.torchrun_command(2, "/v/bin/python", "--steps=3")
    assert command == ["/v/bin/torchrun", "--standalone", "--nproc_per_node=2", "-m",
                       "tools.bench.torch_ddp", "--steps=3"]


def comparison_of(hvd_rate, torch_rate, hvd_wall=30.0, torch_wall=25.0):
    def run(rate, wall, accuracy=0.97):
        return {"wall_seconds": wall, "cpu_seconds": 2 * wall, "images_per_second": rate,
                "launch_to_first_step_seconds": 5.0, "last_step_to_exit_seconds": 2.0,
                "peak_rss_mib": 850.0, "test_accuracy": accuracy}
    medians = {"example": {k: v for k, v in run(1900, 45.0).items() if k != "test_accuracy"},
               "hvd_mnist": run(hvd_rate, hvd_wall), "torch": run(torch_rate, torch_wall)}
    from tools.bench import steady_state
    return {"float32_np2": {
        "np": 2, "precision": "float32", "median": medians,
        "hvd_mnist_over_torch": steady_state.ratios(medians["hvd_mnist"], medians["torch"]),
        "hvd_mnist_over_example": steady_state.ratios(medians["hvd_mnist"],
                                                      medians["example"])}}


def test_the_pytorch_rows_are_set_out_as_part_5s_with_the_ratios():
    text = versus.table(comparison_of(hvd_rate=1800, torch_rate=2000))
    assert text.splitlines()[0] == ("| -np | run | whole process s | CPU s | steady images/s | "
                                    "launch to 1st step s | last step to exit s | "
                                    "peak RSS MiB/rank | test accuracy |")
    assert "| 2 | Horovod's example | 45.0 | 90.0 | 1900 | 5.00 | 2.00 | 850 | – |" in text
    assert "| 2 | hvd_mnist | 30.0 | 60.0 | 1800 | 5.00 | 2.00 | 850 | 97.00% |" in text
    assert "| 2 | PyTorch DDP | 25.0 | 50.0 | 2000 | 5.00 | 2.00 | 850 | 97.00% |" in text
    assert ("| 2 | **hvd_mnist / PyTorch** | 1.20× | 1.20× | 0.900× | 1.00× | 1.00× | 1.00× "
            "|  |") in text
    assert "| 2 | **hvd_mnist / example** | 0.667× |" in text


@pytest.mark.parametrize("hvd_rate, hvd_wall, verdicts", [
    (2100, 24.0, ["met (1.05×)", "met (0.960×)", "met (0.533×)"]),
    (1800, 37.0, ["missed (0.900×)", "missed (1.48×)", "missed (0.822×)"]),
])
def test_the_issues_targets_are_stated_met_or_missed_with_the_ratio(hvd_rate, hvd_wall,
                                                                    verdicts):
    lines = versus.targets(comparison_of(hvd_rate, 2000, hvd_wall, 25.0))
    assert lines == [
        f"float32, -np 2: hvd_mnist's steady images/s at least PyTorch's: {verdicts[0]}",
        f"float32, -np 2: hvd_mnist's whole-process wall at most PyTorch's: {verdicts[1]}",
        "float32, -np 2: hvd_mnist's whole-process wall at most 0.8x Horovod's example's: "
        f"{verdicts[2]}"]


def test_against_the_example_the_target_starts_at_two_workers():
    comparison = comparison_of(2100, 2000, 24.0, 25.0)
    comparison["float32_np2"]["np"] = 1
    assert not any("example" in line for line in versus.targets(comparison))


def test_the_report_says_what_differs_between_the_jobs():
    report = {"versions": {"torch": "2.13.0+cpu", "python": "3.11.7", "numpy": "2.4.6"},
              "repeats": 3, "comparison": comparison_of(1800, 2000)}
    text = "\n".join(versus.section(report))
    assert "PyTorch 2.13.0+cpu, Python 3.11.7" in text
    assert "What differs:" in text and "Why that is fair:" in text
    assert tables.ratio(0.9) in text


def test_the_report_gives_each_rounds_wait_of_the_example_after_its_last_step():
    comparison = comparison_of(1800, 2000)
    comparison["float32_np2"]["runs"] = {"example": [{"end_wait_seconds": w}
                                                     for w in (0.04, 31.26, 0.1)]}
    comparison["mixed_bfloat16_np2"] = {"np": 2, "precision": "mixed_bfloat16", "median": {},
                                        "runs": {"hvd_mnist": [{}]}}
    text = "\n".join(versus.section({"repeats": 3, "comparison": comparison}))
    assert "(the slowest rank, each round): -np 2: 0.0, 31.3, 0.1. Tens of seconds" in text


def test_a_report_from_before_the_wait_was_recorded_leaves_it_out():
    comparison = comparison_of(1800, 2000)
    comparison["float32_np2"]["runs"] = {"example": [{"wall_seconds": 45.0}]}
    assert versus.example_waits(comparison) is None


@pytest.mark.long  # a torchrun -np 2 job: PyTorch's import and Gloo's start-up on each rank
@needs_torch_venv
def test_the_pytorch_job_trains_on_two_ranks_and_prints_its_figures(tiny_data_dir, tmp_path):
    # 25 steps of 8 images per rank: 400 of the tiny set's 480, one 20-step window.
    arrays_dir = versus.write_arrays(tiny_data_dir, str(tmp_path))
    command = versus.torchrun_command(
        2, launch.TORCH_PYTHON, f"--arrays_dir={arrays_dir}", f"--out_dir={tmp_path}", "--steps=25",
        "--batch_size=8", "--timeout_seconds=60", f"--launch_unix_time={time.time()}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=180,
                            cwd=launch.REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = versus.parse_result(result.stdout)
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_workers"] == 2 and summary["threads_per_rank"] >= 1
    assert summary["test_examples"] == 100  # each rank its share, the sums met
    assert summary["test_accuracy"] > 0.3  # the tiny set's bars are learnt within 25 steps
    assert summary["images_per_second"] > 0
    assert len(summary["timing"]["window_images_per_second"]) == 1
    assert len(summary["peak_rss_mib_per_rank"]) == 2
    assert min(summary["peak_rss_mib_per_rank"]) > 100
    assert summary["launch_to_first_step_seconds"] > 0
    assert (tmp_path / "checkpoint.pt").exists()  # rank 0's, at the end
    assert result.stdout.count(versus.RESULT_PREFIX) == 1  # rank 0 alone


def test_the_step_profiles_set_each_piece_of_both_frameworks_side_by_side():
    from tools.bench import step_profile

    def side(framework, scale):
        return {"framework": framework, "batch": 128, "step_ms": 50 * scale,
                "optimizer_ms": 4 * scale,
                "pieces": [{"name": "Conv2D(64)", "forward_ms": 10 * scale,
                            "backward_ms": 20 * scale},
                           {"name": "Dropout(0.5)", "forward_ms": 0.5, "backward_ms": -0.17}],
                "ops": [{"op": "Conv2DBackpropFilter", "ms_per_step": 12.5 * scale}]}
    profile = {"tensorflow": side("TensorFlow 2.21.0", 1.0), "torch": side("PyTorch 2.13.0", 2.0),
               "horovod_allreduce": {"gradient_bytes": 4799528, "allreduce_fp32_seconds": 0.012},
               "torch_allreduce": {"allreduce_flat_seconds": 0.008,
                                   "allreduce_per_tensor_seconds": 0.02}}
    text = step_profile.markdown(profile)
    assert "| Conv2D(64) | 10.0 | 20.0 | 20.0 | 40.0 | 0.500× |" in text
    # A backward below zero is the noise of the two timings it is the difference of.
    assert "| Dropout(0.5) | 0.500 | ≈0 | 0.500 | ≈0 | 1.00× |" in text
    assert "| optimizer update (Adam) | 4.00 |  | 8.00 |  | 0.500× |" in text
    assert "| **the whole step** | 50.0 |  | 100 |  | 0.500× |" in text
    assert ("| allreduce of the gradients at -np 2 (4.8 MB; PyTorch: one flat buffer) | 12.0 |"
            "  | 8.00 |  | 1.50× |") in text
    assert "| Conv2DBackpropFilter | 12.5 | 25% |" in text


def test_a_probe_without_its_line_stops_the_profile_showing_its_output():
    assert launch.last_json_line('PROBE {"a": 1}\nPROBE {"a": 2}\n', "PROBE ") == {"a": 2}
    with pytest.raises(SystemExit, match="no line starting with 'PROFILE ' in:\nTraceback"):
        launch.last_json_line("Traceback (most recent call last):", "PROFILE ")
