"""What a finished run leaves for people to look at, from one real `horovodrun -np 2` job
per training path: TensorBoard scalars, the exported model, plain progress lines,
Horovod's timeline and the plot of both runs."""

import json
import re
import subprocess
import sys

import pytest

from conftest import TINY_TEST, TINY_TRAIN, horovodrun, trainer_command
from tensorboard_events import read_scalars
from hvd_mnist.outputs import tensorboard_log
from tools.bench import launch

pytestmark = pytest.mark.horovodrun

EPOCHS, BATCH_SIZE, LOG_EVERY = 2, 16, 5
STEPS_PER_EPOCH = TINY_TRAIN // (2 * BATCH_SIZE)  # 15: log points at steps 5, 10, 15
SUMMARIES = {}  # mode -> summary.json of its finished run, for the plot


@pytest.fixture(scope="module", params=["custom", "keras"])
def finished_run(request, tiny_data_dir, tmp_path_factory):
    """(mode, model_dir, summary, horovodrun's result) of a 2-epoch run, with the timeline on."""
    mode = request.param
    root = tmp_path_factory.mktemp(mode)
    timeline = root / "timeline.json"
    result = horovodrun(2, ["--timeline-filename", str(timeline), *trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={root / 'model'}", f"--mode={mode}",
        f"--epochs={EPOCHS}", f"--batch_size={BATCH_SIZE}", f"--log_every={LOG_EVERY}")],
        # Generous for a loaded machine, where rank 0's export at the end (others wait in
        # its broadcast) can outlast the usual 30 s; a hang still fails.
        timeout=600, env={"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120"})
    assert result.returncode == 0, result.stdout + result.stderr
    SUMMARIES[mode] = root / "model/summary.json"
    summary = json.loads(SUMMARIES[mode].read_text())
    return mode, root, summary, result


def test_tensorboard_has_every_scalar_at_every_point(finished_run):
    _, root, summary, _ = finished_run
    scalars = read_scalars(str(root / "model/tensorboard"))
    assert sorted(scalars) == sorted(tensorboard_log.TRAIN_TAGS + tensorboard_log.EPOCH_TAGS)
    run_steps = list(range(LOG_EVERY, EPOCHS * STEPS_PER_EPOCH + 1, LOG_EVERY))
    for tag in tensorboard_log.TRAIN_TAGS:
        assert [step for step, _ in scalars[tag]] == run_steps, tag
    for tag in tensorboard_log.EPOCH_TAGS:
        assert [step for step, _ in scalars[tag]] == [1, 2], tag
    for name in ("test_accuracy", "test_loss", "train_loss", "images_per_second"):
        assert [value for _, value in scalars[f"epoch/{name}"]] == pytest.approx(
            [record[name] for record in summary["history"]], rel=1e-6), name
    assert all(value == pytest.approx(2.0) for _, value in scalars["epoch/learning_rate"]), \
        "Adadelta 1.0 scaled by 2 workers"
    assert all(0 < value < 5 for _, value in scalars["train/loss"])


def test_without_a_terminal_progress_is_plain_lines_from_rank_0(finished_run):
    mode, _, _, result = finished_run
    assert "\r" not in result.stdout and "\b" not in result.stdout
    for step in (5, 10, 15):
        assert re.search(rf"{rank_prefix(0)}epoch 2/2 step {step}/{STEPS_PER_EPOCH}: loss "
                         r"\d+\.\d{4}, \d+ images/s", result.stdout), step
    assert not re.search(rf"{rank_prefix(1)}epoch", result.stdout), "only rank 0 prints"


def test_a_run_prints_no_python_warning(finished_run):
    _, _, _, result = finished_run
    assert "Warning:" not in result.stdout + result.stderr


def rank_prefix(rank):
    """What horovodrun puts before a rank's output: [0]<stdout>: with Gloo, [1,0]<stdout>:
    where it launches through Open MPI's mpirun."""
    return rf"\[(1,)?{rank}\]<stdout>:"


def test_timeline_is_written_and_is_json(finished_run):
    _, root, _, _ = finished_run
    events = json.loads((root / "timeline.json").read_text())
    assert any("ALLREDUCE" in json.dumps(event) for event in events)


def test_exported_model_reproduces_the_runs_test_accuracy(finished_run, tiny_data_dir):
    _, root, summary, result = finished_run
    assert f"exported the model to {root / 'model/export'}" in result.stdout
    predicted = subprocess.run(
        [sys.executable, "-m", "hvd_mnist.predict", f"--model={root / 'model/export'}",
         "--test_split", f"--data_dir={tiny_data_dir}"], capture_output=True, text=True,
        timeout=300)
    assert predicted.returncode == 0, predicted.stderr
    lines = predicted.stdout.splitlines()
    assert len(lines) == TINY_TEST + 1 and lines[0].startswith("test[0]: ")
    correct = round(summary["test_accuracy"] * TINY_TEST)
    assert lines[-1] == (f"accuracy: {100 * correct / TINY_TEST:.2f}% ({correct} of "
                         f"{TINY_TEST} images)")


def test_plot_draws_every_finished_run(finished_run, tmp_path):
    summaries = [str(path) for path in SUMMARIES.values()]  # both, with the second run
    out = tmp_path / "plot.png"
    result = subprocess.run([sys.executable, "-m", "tools.plot", f"--out={out}",
                             *summaries], capture_output=True, text=True, timeout=120,
                            cwd=launch.REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {len(summaries)} run(s) -> {out}" in result.stdout
