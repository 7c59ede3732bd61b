"""Rank 0's progress: a live bar on a terminal, plain lines elsewhere, and the numbers in them."""

import io
import os

import pytest

from hvd_mnist.outputs import progress
from hvd_mnist.training import keras_fit


class FakeBoard:
    def __init__(self):
        self.train, self.epochs = [], []

    def train_window(self, run_step, **scalars):
        self.train.append((run_step, scalars))

    def epoch(self, record, learning_rate):
        self.epochs.append((record["epoch"], learning_rate))

    def close(self):
        pass


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_auto_means_a_bar_on_a_terminal_and_lines_on_a_pipe():
    assert progress.resolve_mode("auto", Terminal(), environ={}) == "bar"
    assert progress.resolve_mode("auto", io.StringIO(), environ={}) == "lines"
    assert progress.resolve_mode("bar", io.StringIO(), environ={}) == "bar"
    assert progress.resolve_mode("lines", Terminal(), environ={}) == "lines"


@pytest.mark.parametrize("variable", ["HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"])
def test_auto_means_lines_under_a_launcher_even_on_a_pseudo_terminal(variable):
    # Open MPI gives each worker a pseudo-terminal even when mpirun writes to a CI log.
    assert progress.resolve_mode("auto", Terminal(), environ={variable: "0"}) == "lines"
    assert progress.resolve_mode("bar", io.StringIO(), environ={variable: "0"}) == "bar"


def test_bar_fits_a_terminal_that_reports_no_width(monkeypatch):
    monkeypatch.setattr(progress.shutil, "get_terminal_size",
                        lambda fallback: os.terminal_size(fallback))
    assert progress.bar_size() == (80, 24)
    monkeypatch.setattr(progress.shutil, "get_terminal_size",
                        lambda fallback: os.terminal_size((250, 50)))
    assert progress.bar_size() == (progress.MAX_BAR_COLUMNS, 50)


def test_keras_fit_draws_its_bar_only_in_bar_mode():
    # Keras's Progbar redraws with carriage returns on Linux even into a pipe.
    assert keras_fit.fit_verbosity("bar") == 1 and keras_fit.fit_verbosity("lines") == 2


def test_log_window_means_the_steps_since_the_last_point():
    now = [10.0]
    window = progress.LogWindow(images_per_step=100, clock=lambda: now[0])
    now[0] = 12.0
    assert window.close(4, loss_sum=8.0) == (2.0, 200.0)  # 4 steps of 100 images in 2 s
    now[0] = 13.0
    assert window.close(6, loss_sum=9.0) == (0.5, 200.0)


def run_epoch(mode, capsys, steps=10, log_every=4, show=True):
    board = FakeBoard()
    monitor = progress.TrainingMonitor(mode, epochs=3, steps_per_epoch=steps, images_per_step=64,
                                       log_every=log_every, board=board,
                                       learning_rate=lambda: 0.5, show=show)
    monitor.start_epoch(2)
    for step in range(1, steps + 1):
        monitor.step_done(step, lambda: 0.25 * step)  # every step's loss is 0.25
    monitor.end_epoch({"epoch": 2})
    return capsys.readouterr().out, board


def test_lines_mode_prints_a_line_every_log_every_steps_and_no_carriage_return(capsys):
    out, board = run_epoch("lines", capsys)
    lines = out.splitlines()
    assert "\r" not in out and len(lines) == 2
    assert lines[0].startswith("epoch 2/3 step 4/10: loss 0.2500, ")
    assert lines[1].startswith("epoch 2/3 step 8/10: loss 0.2500, ")
    assert lines[0].endswith(" images/s")
    # TensorBoard gets the same points, counted over the run (epoch 2 starts at step 11).
    assert [step for step, _ in board.train] == [14, 18]
    assert board.train[0][1]["loss"] == 0.25 and board.train[0][1]["learning_rate"] == 0.5
    assert board.epochs == [(2, 0.5)]


def test_bar_mode_redraws_one_line_with_steps_loss_and_images_per_second(capsys):
    out, board = run_epoch("bar", capsys)
    assert out.count("\n") == 1 and out.endswith("\n"), "one line, redrawn, then kept"
    final = out.rstrip("\n").split("\r")[-1]
    assert final.startswith("epoch 2/3: 10/10 |")
    assert final.endswith("loss 0.2500, " + final.split(", ")[-1])
    assert final.split(", ")[-1].endswith(" images/s")
    assert [step for step, _ in board.train] == [14, 18], "TensorBoard still gets its points"


@pytest.mark.parametrize("mode", ["bar", "lines"])
def test_other_ranks_print_nothing_but_log_the_same_points(mode, capsys):
    out, board = run_epoch(mode, capsys, show=False)
    assert out == "" and [step for step, _ in board.train] == [14, 18]


def test_log_every_zero_logs_nothing(capsys):
    out, board = run_epoch("lines", capsys, log_every=0)
    assert out == "" and board.train == [] and board.epochs == [(2, 0.5)]
