"""The Horovod-examples runner's edits and reading of its runs (tools/horovod_examples.py):
the data line replaced, an edit that no longer matches failing loudly, the horovodrun
commands, the loss and error lines found in a log, and the report. No horovodrun here."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools import horovod_examples, horovod_examples_report
from tools.horovod_examples import DATA_LINE, EXAMPLES, Edit

EXAMPLE = f"""    (mnist_images, mnist_labels), _ = \\
        {DATA_LINE}
    opt = tf.optimizers.Adam(0.001 * hvd.size())
    mnist_model = tf.keras.Sequential([])
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
    for batch, (images, labels) in enumerate(dataset.take(10000 // hvd.size())):
        pass


if __name__ == '__main__':
    main()
"""


def test_the_data_line_reads_the_idx_files_and_the_listed_edits_are_made():
    edited = horovod_examples.edited_example(EXAMPLE, "tensorflow2_mnist", "/data/idx")
    assert "tf.keras.datasets" not in edited
    assert ("    (mnist_images, mnist_labels), _ = \\\n        __import__('tools.bench.horovod_"
            "example').bench.horovod_example.load_data('/data/idx')\n") in edited
    assert "opt.variables, root_rank=0" in edited and "opt.variables()" not in edited
    assert "dataset.take(400 // hvd.size())" in edited
    check, main = edited.split("\n\n\nif __name__ == '__main__':")
    assert check.endswith("        print('Weight spread across ranks: %g' % spread)")


def test_the_data_call_names_a_function_that_returns_what_keras_load_data_returns():
    # Read, not imported: importing it imports TensorFlow.
    bench = Path(horovod_examples.ROOT, "tools/bench/horovod_example.py").read_text()
    assert "__import__('tools.bench.horovod_example').bench.horovod_example.load_data(" \
        in horovod_examples.DATA_CALL
    assert '    """(train images, labels), (test images, labels) as load_data() returns them."""' \
        in bench.split("def load_data(idx_dir):\n", 1)[1]


def test_an_edit_that_no_longer_matches_or_matches_twice_fails_loudly():
    with pytest.raises(ValueError, match=r"'opt.lr' is in the example 0 times, not once"):
        horovod_examples.apply_edits(EXAMPLE, (Edit("opt.lr", "opt.learning_rate", ""),))
    with pytest.raises(ValueError, match=r"'hvd.broadcast_variables' is in the example 2 times"):
        horovod_examples.apply_edits(EXAMPLE, (Edit("hvd.broadcast_variables", "x", ""),))
    with pytest.raises(ValueError, match="no longer matches"):  # the data line itself
        horovod_examples.edited_example(EXAMPLE.replace("mnist-%d", "mnist"),
                                        "tensorflow2_mnist", "/data/idx")


@pytest.mark.skipif(not os.environ.get("HOROVOD_SRC"),
                    reason="HOROVOD_SRC names no unpacked Horovod v0.28.1 tree")
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_edit_matches_the_tags_example_once(name):
    source = (Path(os.environ["HOROVOD_SRC"]) / EXAMPLES[name]["path"]).read_text()
    edited = horovod_examples.edited_example(source, name, "/data/idx")
    compile(edited, name, "exec")


def test_the_elastic_example_discovers_one_host_of_two_slots_the_others_get_it_fixed(tmp_path):
    args = SimpleNamespace(horovodrun="/v/horovodrun", python="/v/python")
    static = horovod_examples.horovodrun_command(args, "mpi", "tensorflow2_mnist", tmp_path)
    assert static == ["/v/horovodrun", "--mpi", "-np", "2", "-H", "localhost:2", "/v/python",
                      "tensorflow2_mnist.py"]
    elastic = horovod_examples.horovodrun_command(args, "gloo", "tensorflow2_mnist_elastic",
                                                  tmp_path)
    script = tmp_path / "discover_hosts.sh"
    assert elastic[:9] == ["/v/horovodrun", "--gloo", "-np", "2", "--min-np", "1", "--max-np",
                           "2", "--host-discovery-script"]
    assert elastic[9] == str(script) and os.access(script, os.X_OK)
    assert elastic[10:] == ["--network-interface", "lo", "/v/python",
                            "tensorflow2_mnist_elastic.py"]
    assert script.read_text().splitlines()[-1] == "echo localhost:2"


GLOO_LOG = """[0]<stdout>:Step #0\tLoss: 2.301131
[1]<stderr>:2026-12-03 W tensorflow warning
[0]<stdout>:Step #290\tLoss: 0.132910
[0]<stdout>:Weight spread across ranks: 0
"""
KERAS_LOG = ("[1,0]<stdout>:Epoch 4/4\n[1,0]<stdout>:\r\x1b[1m  1/100\x1b[0m \x1b[32m━\x1b[0m - "
             "loss: 0.5\x08\x08[1,0]<stdout>:\r\x1b[1m100/100\x1b[0m \x1b[32m━━\x1b[0m - 31s - 310ms/step - accuracy: "
             "0.9641 - loss: 0.1196\n")
FAILED_LOG = """[0]<stderr>:Traceback (most recent call last):
[0]<stderr>:    File "/o/before/horovod/tensorflow/__init__.py", line 1063, in gradient  *
[0]<stderr>:AttributeError: 'Variable' object has no attribute 'ref'
[1]<stderr>:AttributeError: 'Variable' object has no attribute 'ref'
horovodrun: process 0 exited with non-zero status 1
"""


def test_a_log_gives_its_first_and_last_loss_lines_and_its_last_error_line():
    assert horovod_examples.summarize(GLOO_LOG) == {
        "first_loss": "Step #0\tLoss: 2.301131", "last_loss": "Step #290\tLoss: 0.132910",
        "loss_lines": 2, "error": "", "weight_spread": "0", "horovod_frame": ""}
    keras = horovod_examples.summarize(KERAS_LOG)
    assert keras["last_loss"] == "100/100 - 31s - 310ms/step - accuracy: 0.9641 - loss: 0.1196"
    failed = horovod_examples.summarize(FAILED_LOG)
    assert failed["last_loss"] == ""
    assert failed["error"] == "AttributeError: 'Variable' object has no attribute 'ref'"
    assert failed["horovod_frame"] == "horovod/tensorflow/__init__.py:1063 (gradient)"
    launcher_only = horovod_examples.summarize(FAILED_LOG.split("\n", 4)[-1])
    assert launcher_only["error"] == "horovodrun: process 0 exited with non-zero status 1"


def test_the_report_lists_each_edit_with_its_reason_and_each_run():
    def run(returncode, log):
        return {"returncode": returncode, "seconds": 42, "load": [1.0, 3.5], "log": "x",
                "command": "horovodrun --gloo -np 2 -H localhost:2 python tensorflow2_mnist.py",
                **horovod_examples.summarize(log)}

    record = {"patches": ["keras3-variables.patch"],
              "environment": {"command": "run", "cpu": "AMD EPYC (AVX2-only), 2 cores",
                              "commit": "abc1234", "date": "2026-12-03",
                              "versions": {"horovod": "0.28.1"}},
              "runs": {"tensorflow2_mnist": {"gloo": {"before": run(1, FAILED_LOG),
                                                      "after": run(0, GLOO_LOG)}}}}
    text = horovod_examples_report.render(record)
    assert ("| gloo | before | **failed**, exit 1: `AttributeError: 'Variable' object has no "
            "attribute 'ref'`, raised in horovod/tensorflow/__init__.py:1063 (gradient) "
            "| 42 s | none | none | none |") in text
    assert ("| gloo | after | ran to the end (2 loss lines) | 42 s | `Step #0\tLoss: 2.301131` "
            "| `Step #290\tLoss: 0.132910` | 0 |") in text
    assert "- `hvd.broadcast_variables(opt.variables(), root_rank=0)` -> " in text
    assert ("added before `if __name__ == '__main__':`:\n\n  ```python\n      # (added) The "
            "largest spread") in text
    assert "the machine was shared" in text and "AVX2-only" in text and "abc1234" in text


def test_a_progress_bar_forwarded_by_open_mpi_keeps_its_prefix_when_read_from_the_log(tmp_path):
    # mpirun writes a progress bar's states after one `[1,0]<stdout>:` prefix, split by
    # carriage returns; reading the log with universal newlines would cut them off it.
    log = tmp_path / "horovodrun.log"
    log.write_bytes(b"[1,0]<stdout>:Epoch 1/1\n[1,0]<stdout>:\r 1/60 - loss: 2.3\x08\x08"
                    b"\r60/60 - 1s/step - loss: 0.11\n")
    summary = horovod_examples.summarize(horovod_examples.read_log(log))
    assert (summary["first_loss"], summary["last_loss"], summary["loss_lines"]) == (
        "1/60 - loss: 2.3", "60/60 - 1s/step - loss: 0.11", 2)
