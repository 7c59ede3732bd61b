"""The bench's own arithmetic (steady state, medians over repeats, ratios against a
committed report), and the program `make bench` compares hvd_mnist with: Horovod's
example, as tools/bench/horovod_example.py runs it."""

import json
import math
import os

import pytest

from conftest import horovodrun
from tools.bench import (__main__ as bench, baselines, launch, machine, stacks, steady_state,
                         tables)

REPORTS = os.path.join(launch.REPO_ROOT, "reports")


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


def test_repeated_runs_give_the_median_of_each_figure_rank_by_rank():
    runs = [{"images_per_second": 900, "peak_rss_mib_per_rank": [700, 650], "command": "a"},
            {"images_per_second": 1000, "peak_rss_mib_per_rank": [720, 640], "command": "b"},
            {"images_per_second": 950, "peak_rss_mib_per_rank": [710, 660], "command": "c"}]
    assert steady_state.median_of_runs(runs) == {"images_per_second": 950,
                                                 "peak_rss_mib_per_rank": [710, 650]}


def test_the_committed_bench_report_is_a_baseline_at_every_np():
    report = baselines.load(os.path.join(REPORTS, "bench.json"))
    ratios = baselines.versus_example_ratios(report)
    assert set(ratios) == {"np1", "np2", "np4"}
    for figures in ratios.values():
        assert {"images_per_second", "launch_to_first_step_seconds"} <= set(figures)


def test_a_ratio_is_set_beside_the_baselines_by_dividing_them():
    today = {"np2": {"images_per_second": 1.5, "peak_rss_mib": 0.4}, "custom_over_keras": 1.0}
    baseline = {"np2": {"images_per_second": 1.25}, "np4": {"images_per_second": 2.0},
                "custom_over_keras": 0.8}
    # Only what both measured: np4 is the baseline's alone, peak RSS today's alone.
    assert baselines.changes(today, baseline) == {"np2": {"images_per_second": 1.2},
                                                  "custom_over_keras": 1.25}


def test_without_a_baseline_report_there_is_none(tmp_path):
    assert baselines.load(str(tmp_path / "bench.json")) is None


def test_an_unreadable_baseline_stops_the_bench_naming_the_file(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text("{not json")
    with pytest.raises(SystemExit, match=f"cannot read the baseline {path}"):
        baselines.load(str(path))


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
    (["paths", "accuracy", "inputs", "versus", "torch", "limit"], "reports/bench.json"),
    (["limit", "torch", "versus", "paths", "accuracy", "inputs"], "reports/bench.json"),  # any order
    (["paths", "accuracy", "inputs", "versus", "limit"],  # make bench without PyTorch
     "reports/bench_paths_accuracy_inputs_versus_limit.json"),
    (["torch"], "reports/bench_torch.json"),  # make bench-torch
    (["paths", "accuracy", "inputs", "versus"], "reports/bench_paths_accuracy_inputs_versus.json"),
    (["inputs"], "reports/bench_inputs.json"),
    (["versus", "paths"], "reports/bench_paths_versus.json"),  # in the parts' own order
])
def test_a_run_of_some_parts_never_replaces_the_full_report(parts, path):
    assert bench.report_path("reports/bench.json", parts) == path


def test_a_stack_is_summed_up_by_its_medians_and_its_spread():
    runs = [{"images_per_second": rate, "peak_rss_mib_per_rank": [rss, rss - 20]}
            for rate, rss in ((2400, 730), (2600, 700), (2500, 760))]
    assert stacks.summarize(runs) == {
        "images_per_second": 2500, "peak_rss_mib_per_rank": [730, 710],
        "images_per_second_lowest": 2400, "images_per_second_highest": 2600,
        "peak_rss_mib": 730}


@pytest.mark.parametrize("new_over_old, met", [(1.02, True), (1.0, True), (0.99, False)])
def test_the_new_stack_must_not_be_slower_at_any_np(new_over_old, met):
    comparison = {"np1": {"new_over_old": {"images_per_second": 1.1}},
                  "np2": {"new_over_old": {"images_per_second": new_over_old}}}
    assert stacks.not_slower(comparison) == {"np1": True, "np2": met}


def test_a_stack_without_its_own_horovodrun_stops_the_bench_naming_it(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    with pytest.raises(SystemExit, match=f"no {tmp_path}/bin/horovodrun for the old stack"):
        stacks.stack("old", str(tmp_path))


def test_each_stack_runs_its_own_python_and_horovodrun(tmp_path):
    for program in ("python", "horovodrun"):
        (tmp_path / "bin").mkdir(exist_ok=True)
        (tmp_path / "bin" / program).touch()
    stack = stacks.stack("old", str(tmp_path))
    assert stack["python"] == str(tmp_path / "bin" / "python")
    command = launch.horovodrun_command(2, [stack["python"]], bin_dir=stack["bin_dir"])
    assert command[0] == str(tmp_path / "bin" / "horovodrun")
    assert stack["env"]["PATH"].startswith(str(tmp_path / "bin") + os.pathsep)


def test_the_stacks_report_names_the_cpu_both_stacks_and_the_verdict():
    def summary(rate):
        return {"images_per_second": rate, "images_per_second_lowest": rate - 50,
                "images_per_second_highest": rate + 50, "launch_to_first_step_seconds": 4.0,
                "peak_rss_mib_per_rank": [730.2, 712.9], "peak_rss_mib": 730.2,
                "wall_seconds": 12.0, "test_accuracy": 0.9589}
    versions = {"python": "3.12.1", "tensorflow": "2.21.0", "keras": "3.15.1",
                "horovod": "0.28.1", "numpy": "2.5.5"}
    medians = {"new": summary(2450.4), "old": summary(2500.0)}
    report = {"date": "2026-12-02 09:00 UTC", "wall_seconds": 600.0, "steps": 140,
              "repeats": 3, "machine": "2 cores (Intel(R) Xeon(R), AVX-512 + AMX), 24 GiB",
              "venvs": {"new": "/r/.venv", "old": "/r/.venv-tf2.15"},
              "versions": {"new": versions, "old": {**versions, "tensorflow": "2.15.1",
                                                    "keras": "2.15.0", "python": "3.11.7"}},
              "comparison": {"np2": {"np": 2, "median": medians,
                                     "new_over_old": steady_state.ratios(medians["new"],
                                                                         medians["old"])}},
              "not_slower": {"np2": False}}
    text = stacks.markdown(report)
    assert "AVX-512 + AMX" in text
    assert "| 2 | new: TF 2.21.0, Keras 3.15.1, Python 3.12.1 | 2450 (2400–2500) | 4.00 |" in text
    assert "| 2 | old: TF 2.15.1, Keras 2.15.0, Python 3.11.7 |" in text
    assert "| 2 | **new / old** | 0.980× |" in text
    assert "**not met** at -np 2." in text


@pytest.mark.parametrize("cpu_flags, unit", [
    ("avx avx2 fma", "AVX2-only"), ("avx2 avx512f avx512bw", "AVX-512"),
    ("avx2 avx512f avx512_bf16", "AVX-512 + BF16"),
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "AVX-512 + BF16 + AMX"),
    ("avx2 avx512f amx_bf16 amx_tile", "AVX-512 + AMX"), ("sse sse2", "no AVX2")])
def test_a_report_names_the_cpus_vector_unit(cpu_flags, unit):
    assert machine.vector_unit(cpu_flags.split()) == unit


def test_the_cpu_is_read_from_proc_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
                       "flags\t\t: fpu avx2 avx512f amx_tile\n")
    assert machine.cpu(str(cpuinfo)) == {"model": "Intel(R) Xeon(R) Processor",
                                         "vector_unit": "AVX-512 + AMX"}
    assert machine.cpu(str(tmp_path / "absent"))["model"] == "unknown CPU"


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
        assert report["peak_rss_mib"] > 100
    assert list(tmp_path.glob("checkpoints-1.index"))  # rank 0's checkpoint at the end
