"""The Horovod-suite runner's reading of its results (tools/horovod_suite.py): each rank's
JUnit file, the ranks combined, parameterized names, the scratch copies' edits and which
patches it can toggle in a copy of the installed package."""

import subprocess

import pytest

from tools import horovod_suite, horovod_suite_cases
from tools.horovod_suite_cases import Case

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="4">
<testcase classname="test_tensorflow2_keras.Tf2KerasTests" name="test_from_config" time="0.1"/>
<testcase classname="test_tensorflow2_keras.Tf2KerasTests" name="test_sparse_as_dense" time="0.2">
<failure message="ValueError: Argument(s) not recognized: {'lr': 0.0001}">traceback
more</failure></testcase>
<testcase classname="test_tensorflow2_keras.Tf2KerasTests" name="test_elastic_state" time="0.1">
<error message="">KeyError: (0,)
second line</error></testcase>
<testcase classname="test_tensorflow2_keras.Tf2KerasTests" name="test_gpu" time="0.0">
<skipped type="pytest.skip" message="No GPUs available">skipped</skipped></testcase>
</testsuite></testsuites>"""

K = "test_tensorflow2_keras.Tf2KerasTests::"


def test_a_junit_file_gives_each_test_its_outcome_and_first_message_line():
    assert horovod_suite.parse_junit(JUNIT) == {
        K + "test_from_config": ("passed", ""),
        K + "test_sparse_as_dense": ("failed", "ValueError: Argument(s) not recognized: {'lr': 0.0001}"),
        K + "test_elastic_state": ("failed", "KeyError: (0,)"),  # an error counts as a failure
        K + "test_gpu": ("skipped", "No GPUs available"),
    }


def test_a_test_fails_when_either_rank_failed_it_or_did_not_report_it():
    rank0 = {"a": ("passed", ""), "b": ("failed", "boom"), "c": ("skipped", "one rank"),
             "d": ("passed", "")}
    rank1 = {"a": ("passed", ""), "b": ("passed", ""), "c": ("passed", "")}
    combined = horovod_suite.combine_ranks([rank0, rank1])
    assert combined == {"a": ("passed", ""), "b": ("failed", "boom"), "c": ("passed", ""),
                        "d": ("failed", "not reported by every rank")}
    assert horovod_suite.counts(combined) == {"passed": 2, "failed": 2, "skipped": 0}


@pytest.mark.parametrize("test_id, function", [
    (K + "test_gradient_aggregation_0", "test_gradient_aggregation"),  # parameterized.expand
    (K + "test_gradient_aggregation_with_local_vars_1", "test_gradient_aggregation_with_local_vars"),
    (K + "test_from_config", "test_from_config"),
    ("test_tensorflow.TensorFlowTests::test_horovod_syncbn_cpu", "test_horovod_syncbn_cpu"),
])
def test_a_parameterized_test_is_explained_under_its_function_name(test_id, function):
    assert horovod_suite._function_name(test_id) == function


SOURCE = '''class T:
    def test_one(self):
        opt = RMSprop(lr=0.1)

    @parameterized.expand([[1]])
    def test_two(self, x):
        opt = RMSprop(lr=0.1)
'''


def test_an_edit_changes_only_its_own_test():
    edited = horovod_suite_cases.apply_edits(
        SOURCE, {"test_two": Case("lr", (("lr=0.1", "learning_rate=0.1"),))})
    assert edited.count("RMSprop(lr=0.1)") == 1  # test_one keeps its own
    assert "    def test_two(self, x):\n        opt = RMSprop(learning_rate=0.1)" in edited


def test_an_edit_that_no_longer_matches_its_test_fails_loudly():
    with pytest.raises(ValueError, match="test_one: 'learning_rate' is not in the test"):
        horovod_suite_cases.apply_edits(SOURCE, {"test_one": Case("x", (("learning_rate", "lr"),))})
    with pytest.raises(ValueError, match="no method test_three"):
        horovod_suite_cases.apply_edits(SOURCE, {"test_three": Case("x", (("a", "b"),))})


def test_every_stack_applies_the_same_patches_and_the_python_ones_can_be_toggled():
    pins = sorted(horovod_suite.ROOT.glob("tools/pins/tf*.txt"))
    # tf<version>-<flavour>.txt (the GPU build's) adds its patches to its stack's.
    stacks = [p for p in pins if "-" not in p.stem]
    flavours = [p for p in pins if "-" in p.stem]
    assert stacks and flavours
    python_patches = ["elastic-discovery-subprocess.patch", "elastic-errors-raised.patch",
                      "keras3-variables.patch",
                      "keras3-keras-api.patch", "launcher-one-line.patch",
                      "launcher-build-checks-recorded.patch", "launcher-gone-shell.patch"]
    for pins_file in stacks:
        names = [p.name for p in horovod_suite.patches_from_pins(pins_file)]
        assert names[-len(python_patches):] == python_patches, pins_file
    for pins_file in flavours:
        names = [p.name for p in horovod_suite.patches_from_pins(pins_file)]
        assert names and not set(names) & set(python_patches), pins_file
    toggled = horovod_suite.python_only(
        horovod_suite.patches_from_pins(horovod_suite.ROOT / "tools/pins/tf2.21.txt"))
    assert [p.name for p in toggled] == python_patches  # not the CMake one
    for patch in toggled:
        assert all(f.startswith("horovod/") and f.endswith(".py")
                   for f in horovod_suite.patched_files(patch)), patch.name


def test_the_overlay_reverses_or_applies_a_patch_whatever_the_installed_tree_has(tmp_path):
    installed = tmp_path / "site" / "horovod"
    (installed / "runner").mkdir(parents=True)
    (installed / "runner" / "a.py").write_text("x = 1\ny = 2\n")
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/horovod/runner/a.py\n+++ b/horovod/runner/a.py\n"
                     "@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3\n")
    for stage, text in (("before", "y = 2"), ("after", "y = 3")):
        horovod_suite.make_overlay(installed, [patch], stage, tmp_path / stage)
        assert text in (tmp_path / stage / "horovod/runner/a.py").read_text()
    subprocess.run(["patch", "-p1", "-s", "-d", str(tmp_path / "site")], stdin=patch.open(),
                   check=True)  # now the installed tree has it
    horovod_suite.make_overlay(installed, [patch], "before", tmp_path / "before")
    assert "y = 2" in (tmp_path / "before/horovod/runner/a.py").read_text()


def test_the_report_names_what_the_patches_fixed_broke_and_left_with_its_evidence():
    from tools import horovod_suite_report
    env = {"command": "run", "cpu": "AMD EPYC (AVX2-only), 2 cores", "commit": "abc1234",
           "date": "2026-12-03", "versions": {"horovod": "0.28.1"}}
    t = "test_tensorflow2_keras.Tf2KerasTests::"

    def stage(results, **extra):
        return {"results": results, "seconds": 9, "timed_out": False, "ranks_reported": 2,
                **extra}

    record = {"patches": ["keras3-variables.patch"], "environments": {"gloo": env},
              "controllers": {"gloo": {"test_tensorflow2_keras.py": {
                  "before": stage({t + "test_from_config": ("failed", "ref"),
                                   t + "test_elastic_state": ("passed", ""),
                                   t + "test_sparse_as_dense": ("failed", "lr")}),
                  "after": stage({t + "test_from_config": ("passed", ""),
                                  t + "test_elastic_state": ("failed", "boom"),
                                  t + "test_sparse_as_dense": ("failed", "lr")},
                                 scratch={t + "test_sparse_as_dense": ("passed", "")})}}}}
    text = horovod_suite_report.render(record)
    assert "| test_tensorflow2_keras.py | 1 / 2 / 0 | 1 / 2 / 0 | 9 s |" in text
    assert "Fixed by the patches (1): `test_from_config`." in text
    assert "Passing before, failing after (1): `test_elastic_state` (boom)." in text
    still = [line for line in text.splitlines() if "`test_sparse_as_dense`" in line]
    assert len(still) == 1 and "`lr=`" in still[0] and still[0].endswith("| passes |")
    assert "abc1234" in text and "AVX2-only" in text


def test_an_integration_file_is_one_process_and_gets_its_own_section():
    from tools import horovod_suite_report
    assert set(horovod_suite.INTEGRATION_FILES).isdisjoint(horovod_suite.FILES)
    one = {"results": {"a::b": ("passed", "")}, "seconds": 5, "timed_out": False,
           "ranks_reported": 1, "ranks": 1}
    assert horovod_suite_report._cell(one) == "1 / 0 / 0"
    assert horovod_suite_report._cell({**one, "ranks_reported": 0, "results": {}}) \
        == "0 / 0 / 0 (0 of 1 ranks reported)"
    env = {"command": "run", "cpu": "c", "commit": "x", "date": "d", "versions": {}}
    section = "\n".join(horovod_suite_report._controller_section(
        "integration", {"test_static_run.py": {"before": one, "after": one}}, env))
    assert section.startswith("## Integration\n\ntest/integration's files, each under plain")


def test_a_section_run_with_other_patches_than_the_header_names_its_own():
    from tools import horovod_suite_report
    env = {"command": "run", "cpu": "c", "commit": "x", "date": "d", "versions": {}}
    one = {"results": {}, "seconds": 5, "timed_out": False, "ranks_reported": 1, "ranks": 1}
    record = {"patches": ["a.patch"],
              "environments": {"gloo": {**env, "patches": ["a.patch"]},
                               "integration": {**env, "patches": ["a.patch", "b.patch"]}},
              "controllers": {"gloo": {}, "integration": {"test_static_run.py":
                                                          {"before": one, "after": one}}}}
    text = horovod_suite_report.render(record)
    assert text.count("in this section") == 1
    assert "- patches reversed before and applied after in this section: a.patch, b.patch" in text


def test_a_run_stops_unless_its_python_imports_the_overlays_horovod(tmp_path):
    import os
    import sys
    overlay = tmp_path / "overlay"
    (overlay / "horovod").mkdir(parents=True)
    (overlay / "horovod" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(overlay)}
    horovod_suite.check_overlay(sys.executable, env, tmp_path, overlay)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    relative = {**os.environ, "PYTHONPATH": "overlay"}  # relative to another directory
    with pytest.raises(SystemExit, match="not the overlay"):
        horovod_suite.check_overlay(sys.executable, relative, elsewhere, overlay)


def test_a_stage_not_run_says_so():
    from tools import horovod_suite_report
    env = {"command": "run", "cpu": "c", "commit": "x", "date": "d", "versions": {}}
    after = {"results": {"t::a": ("passed", "")}, "seconds": 5, "timed_out": False,
             "ranks_reported": 1, "ranks": 1}
    section = horovod_suite_report._controller_section(
        "integration", {"test_static_run.py": {"after": after}}, env)
    assert "| test_static_run.py | not run | 1 / 0 / 0 | 5 s |" in section
    skipped = {**after, "results": {"t::a": ("skipped", "no ssh"), "t::b": ("skipped", "no ssh")}}
    section = horovod_suite_report._controller_section(
        "integration", {"test_static_run.py": {"after": skipped}}, env)
    assert "- test_static_run.py: 2 skipped: no ssh" in section


def test_an_integration_scripts_edit_that_no_longer_matches_fails_loudly():
    script, case = horovod_suite_cases.SCRIPT_CASES["test_elastic_tensorflow2.py"]
    assert script == "data/elastic_tensorflow2_main.py"
    edited = horovod_suite_cases.apply_script_edits("    optimizer.lr.assign(lr * 2)\n", case)
    assert edited == "    optimizer.learning_rate.assign(lr * 2)\n"
    with pytest.raises(ValueError, match="not in the script once"):
        horovod_suite_cases.apply_script_edits(edited, case)


def test_a_scratch_copys_test_is_matched_whatever_path_pytest_names_its_class_by():
    assert horovod_suite._module_class("build.x.integration.test_e.Tests::test_a") \
        == "test_e.Tests::test_a"
    assert horovod_suite._module_class("test_e.Tests::test_a") == "test_e.Tests::test_a"


def test_a_scratch_copys_outcome_is_found_for_the_test_as_the_suite_named_it(tmp_path,
                                                                             monkeypatch):
    # The suite's run names a class from Horovod's tree (test.integration.test_x.Tests);
    # pytest in the scratch copy, from wherever its rootdir falls (build.x.integration....).
    source = tmp_path / "horovod" / "test"
    (source / "integration" / "data").mkdir(parents=True)
    (source / "integration" / "test_elastic_tensorflow2.py").write_text("# the tests\n")
    (source / "integration" / "data" / "elastic_tensorflow2_main.py").write_text(
        "    optimizer.lr.assign(lr * hvd.size())\n")
    seen = {}

    def run_file(args, controller, test_dir, test_file, pythonpath, junit_dir, node_ids=()):
        seen["script"] = (test_dir / "data" / "elastic_tensorflow2_main.py").read_text()
        seen["node_ids"] = list(node_ids)
        return {"results": {
            "build.x.integration.test_elastic_tensorflow2.Tests::test_reset_limit":
                ("passed", "")}}

    monkeypatch.setattr(horovod_suite, "run_file", run_file)
    failing = ["test.integration.test_elastic_tensorflow2.Tests::test_reset_limit",
               "test.integration.test_elastic_tensorflow2.Tests::test_single_rank_failure"]
    evidence = horovod_suite.scratch_evidence(None, "integration", source / "integration",
                                              "test_elastic_tensorflow2.py", failing,
                                              tmp_path / "overlay", tmp_path / "out")
    assert seen["script"] == "    optimizer.learning_rate.assign(lr * hvd.size())\n"
    assert seen["node_ids"] == ["test_elastic_tensorflow2.py::Tests::test_reset_limit",
                                "test_elastic_tensorflow2.py::Tests::test_single_rank_failure"]
    assert evidence == {failing[0]: ("passed", ""),
                        failing[1]: ("failed", "not run in the scratch copy")}
