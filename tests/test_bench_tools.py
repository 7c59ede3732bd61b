"""The bench's own arithmetic (steady state, medians over repeats, time to accuracy, which
precisions the limit runs), and the program `make bench` compares hvd_mnist with: Horovod's
example, as tools/bench/horovod_example.py runs it."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from conftest import horovodrun
from hvd_mnist.outputs import progress
from tools.bench import (__main__ as bench, elastic, flops, launch, limit, machine,
                         steady_state, tables, training_paths)


@pytest.mark.parametrize("windows, expected", [
    ([900, 2000, 2100, 2050], 2050),  # the first window (tracing) is dropped
    ([900, 2000, 2100], 2050),        # an even count: the mean of the middle two
    ([900], 900),                     # a smoke run's one window is kept
])
def test_steady_rate_is_the_median_of_the_windows_after_the_first(windows, expected):
    assert steady_state.images_per_second(windows) == expected


def test_a_run_without_a_window_has_no_rate():
    assert math.isnan(steady_state.images_per_second([]))


@pytest.mark.parametrize("step_times, windows", [
    (41, 2),  # 41 step ends: two windows of 20 steps
    (40, 1),  # one short of the second window
    (21, 1),  # a window needs the end of the step before it
    (20, 0),
])
def test_step_times_are_cut_into_the_trainers_windows(step_times, windows):
    # Steps 0.1 s apart, 256 images each: 2560 images/s in every window.
    times = [100 + 0.1 * i for i in range(step_times)]
    assert steady_state.windows_from_step_times(times, 256) == pytest.approx([2560] * windows)


def test_seconds_per_step_leave_out_the_first_step():
    # 40 steps: the first ends at 10.0, the last at 13.9, 39 steps of 0.1 s between them.
    assert steady_state.seconds_per_step_after_first(10.0, 13.9, 40) == pytest.approx(0.1)


def test_repeated_runs_give_the_median_of_each_figure():
    runs = [{"images_per_second": 900, "peak_rss_mib": 700, "command": "a"},
            {"images_per_second": 1000, "peak_rss_mib": 720, "command": "b"},
            {"images_per_second": 950, "peak_rss_mib": 710, "command": "c"}]
    assert steady_state.median_of_runs(runs) == {"images_per_second": 950, "peak_rss_mib": 710}


def test_time_to_accuracy_is_the_training_seconds_of_the_first_epoch_at_the_target():
    summary = {"history": [{"train_seconds": 40.0, "test_accuracy": 0.985},
                           {"train_seconds": 35.0, "test_accuracy": 0.9901},
                           {"train_seconds": 35.0, "test_accuracy": 0.992}]}
    curve = training_paths.accuracy_curve(summary)
    assert curve == [(40.0, 0.985), (75.0, 0.9901), (110.0, 0.992)]
    assert training_paths.seconds_to_accuracy(curve) == (75.0, 2)
    assert training_paths.seconds_to_accuracy(curve[:1]) == (None, None)  # never reached


def test_training_costs_forward_plus_both_gradients_except_the_images_gradient():
    from hvd_mnist.training import model as model_lib
    cost = flops.training_flops_per_image(model_lib.build_model())
    conv1, conv2, dense1, dense2 = cost["per_layer_forward"].values()
    assert conv1 == 2 * 26 * 26 * 32 * 3 * 3 * 1
    assert conv2 == 2 * 24 * 24 * 64 * 3 * 3 * 32
    assert (dense1, dense2) == (2 * 12 * 12 * 64 * 128, 2 * 128 * 10)
    assert cost["forward"] == conv1 + conv2 + dense1 + dense2
    assert cost["training"] == 3 * cost["forward"] - conv1


def test_the_forward_count_agrees_with_tensorflows_profiler_within_one_percent():
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)
    from hvd_mnist.data import mnist
    from hvd_mnist.training import model as model_lib
    model = model_lib.build_model()
    forward = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([1, *mnist.IMAGE_SHAPE], tf.float32))
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profiled = tf.compat.v1.profiler.profile(
        graph=convert_variables_to_constants_v2(forward).graph,
        run_meta=tf.compat.v1.RunMetadata(), cmd="op", options=options).total_float_ops
    # The profiler also counts bias adds, activations and pooling, which flops.py leaves out.
    counted = flops.training_flops_per_image(model)["forward"]
    assert counted <= profiled <= 1.01 * counted


def test_a_precision_far_slower_than_float32_is_not_run_under_horovod():
    rates = {"float32": 2000.0, "mixed_bfloat16": 3500.0, "mixed_float16": 12.0}
    assert limit.too_slow(rates) == {"mixed_float16": "not run under Horovod: its step alone "
                                     "ran at 0.01x float32's"}


def test_a_precision_too_slow_here_is_left_out_of_the_accuracy_runs():
    # bfloat16 on a CPU without its instructions: 0.11x float32's on the AVX2-only EPYC.
    runs = training_paths.accuracy_runs({"mixed_bfloat16": "its step alone ran at 0.11x"})
    assert list(runs) == ["seed_custom", "seed_keras", "fast_custom"]
    assert training_paths.accuracy_runs() == training_paths.ACCURACY_RUNS


@pytest.mark.parametrize("value, cell", [
    (784214.486, "784214"),  # images/s: whole numbers
    (3433.78, "3434"),
    (116.3647903860001, "116"),  # seconds of 100 or more too
    (99.96, "100"),  # rounds up into the whole numbers
    (99.94, "99.9"),
    (3.8322811126708984, "3.83"),  # 3 significant figures below 100
    (0.5, "0.500"),  # trailing zeros kept, so a column lines up
    (0.08419450000019424, "0.0842"),
    (None, "–"),  # never reached (time to accuracy)
    (math.nan, "–"),
])
def test_figures_are_rounded_to_what_the_noise_leaves(value, cell):
    assert tables.figure(value) == cell


def test_ratios_carry_a_times_sign_and_tables_are_markdown():
    assert tables.ratio(1.035895623014) == "1.04×"
    assert tables.ratio(None) == "–"
    assert tables.markdown(["-np", "images/s"], [[1, "3405"], [2, "2514"]]) == (
        "| -np | images/s |\n|---|---|\n| 1 | 3405 |\n| 2 | 2514 |")


@pytest.mark.parametrize("parts, path", [
    (["paths", "accuracy", "versus", "torch", "limit"], "reports/bench.json"),
    (["limit", "torch", "versus", "paths", "accuracy"], "reports/bench.json"),  # any order
    (["paths", "accuracy", "versus", "limit"],  # make bench without PyTorch
     "reports/bench_paths_accuracy_versus_limit.json"),
    (["torch"], "reports/bench_torch.json"),  # make bench-torch
    (["versus", "paths"], "reports/bench_paths_versus.json"),  # in the parts' own order
])
def test_a_run_of_some_parts_never_replaces_the_full_report(parts, path):
    assert bench.report_path("reports/bench.json", parts) == path


@pytest.mark.parametrize("cpu_flags, unit", [
    ("avx avx2 fma", "AVX2-only"), ("avx2 avx512f avx512bw", "AVX-512"),
    ("avx2 avx512f avx512_bf16", "AVX-512 + BF16"),
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "AVX-512 + BF16 + AMX"),
    ("avx2 avx512f amx_bf16 amx_tile", "AVX-512 + AMX"), ("sse sse2", "no AVX2")])
def test_a_report_names_the_cpus_vector_unit(cpu_flags, unit):
    assert machine.vector_unit(cpu_flags.split()) == unit


def test_the_cpu_is_read_from_proc_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\n"
                       "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
                       "processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n")
    assert machine.cpu(str(cpuinfo)) == {"model": "AMD EPYC", "family": "family 26 model 2",
                                         "vector_unit": "AVX-512 + BF16"}
    absent = machine.cpu(str(tmp_path / "absent"))
    assert absent == {"model": "unknown CPU", "family": "", "vector_unit": "no AVX2"}


def test_ratios_cover_the_numbers_both_sides_hold():
    assert steady_state.ratios({"a": 3.0, "b": 1.0, "only_here": 5.0},
                               {"a": 2.0, "b": 4.0, "text": "x"}) == {"a": 1.5, "b": 0.25}


@pytest.mark.long  # two minutes of a -np 2 job that only make bench needs
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
        assert report["loop_end_unix_time"] >= report["step_unix_times"][-1]
        assert report["peak_rss_mib"] > 100
    assert list(tmp_path.glob("checkpoints-1.index"))  # rank 0's checkpoint at the end


def test_the_report_and_the_time_to_accuracy_curves_are_written(tmp_path):
    curve = [(30.0, 0.9871), (60.0, 0.9904)]
    results = {"machine": "2 cores", "date": "today", "parts": ["accuracy"], "bench_seconds": 1.0,
               "time_to_accuracy": {"fast_custom": {"training_seconds": 60.0, "epoch": 2,
                                                    "curve": curve, "over_seed_custom": None}}}
    bench.write_reports(str(tmp_path / "bench_accuracy.json"), results)
    assert json.loads((tmp_path / "bench_accuracy.json").read_text()) == json.loads(
        json.dumps(results))
    markdown = (tmp_path / "bench_accuracy.md").read_text()
    assert "| fast_custom | 60.0 | – | 2 | 98.71%, 99.04% |" in markdown
    assert markdown.startswith("`make bench` on 2 cores, today")  # no command recorded
    png = tmp_path / "bench_accuracy_time_to_accuracy.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_partial_report_names_the_command_that_made_it(tmp_path):
    results = {"machine": "2 cores", "date": "today", "parts": ["torch"], "bench_seconds": 1.0,
               "command": "python -m tools.bench --parts=torch --nps=2"}
    bench.write_reports(str(tmp_path / "bench_torch.json"), results)
    assert (tmp_path / "bench_torch.md").read_text().startswith(
        "`python -m tools.bench --parts=torch --nps=2` on 2 cores, today")


def test_a_report_names_the_arithmetic_settings_its_runs_had():
    environ = {"ONEDNN_MAX_CPU_ISA": "AVX2", "HOME": "/root"}
    assert bench.command_line(["--parts=torch"], environ) == (
        "ONEDNN_MAX_CPU_ISA=AVX2 python -m tools.bench --parts=torch")
    assert bench.command_line([], {}) == "python -m tools.bench"


def test_a_report_does_not_name_the_setting_hvd_mnist_makes_for_itself():
    # Importing hvd_mnist turns TensorFlow's oneDNN kernels on by setting
    # TF_ENABLE_ONEDNN_OPTS; a bench started without it must not report it as given.
    environ = {k: v for k, v in os.environ.items() if k not in bench.ARITHMETIC_ENV}
    program = ("import tools.bench.__main__ as b, hvd_mnist.worker.cpu_kernels as c; "
               "c.prefer_onednn(); print(b.command_line([], b.GIVEN_ENVIRONMENT))")
    out = subprocess.run([sys.executable, "-c", program], env=environ, capture_output=True,
                         text=True, check=True, cwd=launch.REPO_ROOT).stdout
    assert out.strip() == "python -m tools.bench"


class NoBoard:
    def train_window(self, run_step, **scalars):
        pass


def test_the_elastic_recovery_is_timed_from_the_step_lines_rank_0_prints(capsys):
    monitor = progress.TrainingMonitor("lines", epochs=2, steps_per_epoch=60,
                                       images_per_step=256, log_every=1, board=NoBoard(),
                                       learning_rate=lambda: 0.002, show=True)
    monitor.start_epoch(1, done_steps=20)
    monitor.step_done(21, lambda: 0.5)
    line = "[0]<stdout>:" + capsys.readouterr().out  # as horovodrun forwards it
    assert re.search(elastic.STEP, line).groups() == ("1", "21")
