"""What rank 0 shows while an epoch runs: a live bar on a terminal, plain lines elsewhere.

`--progress=bar` draws a tqdm bar (steps done, time, the epoch's mean loss so far,
images/s over all workers), redrawn in place with carriage returns;
`--progress=lines` prints one line every --log_every steps and never a carriage
return, for CI and log files; `auto` (the default) picks the bar when this
process's stdout is a terminal and no launcher started it. Under horovodrun a
worker cannot tell: with Gloo its stdout is a pipe (horovodrun reads it and
prefixes `[0]<stdout>:`), through Open MPI's mpirun a pseudo-terminal even when
mpirun's own output goes to a log, so `auto` gives lines there; `make train`
looks at its own stdout instead and passes `--progress=bar` or `lines` (see the
Makefile). horovodrun forwards each carriage-return-ended
piece as it arrives, so the bar still redraws in place through it.

`TrainingMonitor` is what the training loops call: the bar or the lines, and,
every --log_every steps, TensorBoard's step scalars (tensorboard_log.py).
"""

import os
import shutil
import sys
import time

import tqdm

from hvd_mnist.outputs import tensorboard_log, timing
from hvd_mnist.worker import runtime

# The bar asks for the loss (which waits for the step in flight) at most this often.
BAR_REDRAW_SECONDS = 0.1


# Set in every process that horovodrun starts, with Gloo or through Open MPI's mpirun.
LAUNCHER_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
# Bar lines wider than the terminal would wrap and break the redraw in place.
MAX_BAR_COLUMNS = 100


def resolve_mode(mode: str, stream=None, environ=os.environ) -> str:
    """"bar" or "lines": what `mode` means for output going to `stream`.

    A launcher's worker never decides by itself: Gloo hands it a pipe, but Open
    MPI a pseudo-terminal even when mpirun's own output goes to a CI log.
    """
    if mode != "auto":
        return mode
    if any(name in environ for name in LAUNCHER_VARIABLES):
        return "lines"
    stream = stream or sys.stdout
    return "bar" if hasattr(stream, "isatty") and stream.isatty() else "lines"


def bar_size() -> tuple:
    """(columns, rows) for tqdm: the terminal's, at most MAX_BAR_COLUMNS wide; 80x24 where
    it reports none. Open MPI's pseudo-terminals report 0x0, and with 0 rows tqdm
    draws nothing at all."""
    size = shutil.get_terminal_size((80, 24))
    return min(size.columns, MAX_BAR_COLUMNS), size.lines


class LogWindow:
    """Mean loss and images/s over the steps since the last --log_every point."""

    def __init__(self, images_per_step: int, clock=time.perf_counter):
        self.images_per_step, self.clock = images_per_step, clock
        self.restart()

    def restart(self, step: int = 0) -> None:
        """A new window after step `step` of the epoch, with no loss summed yet."""
        self._start, self._step, self._loss_sum = self.clock(), step, 0.0

    def close(self, step: int, loss_sum: float):
        """(mean loss, images/s) of the steps after the previous close up to `step`.

        `loss_sum` is the sum of the step losses since `restart`.
        """
        now = self.clock()
        steps = step - self._step
        result = ((loss_sum - self._loss_sum) / steps,
                  timing.images_per_second(steps * self.images_per_step, now - self._start))
        self._start, self._step, self._loss_sum = now, step, loss_sum
        return result


def monitor_for_run(*, progress: str, log_every: int, model_dir: str, epochs: int,
                    steps_per_epoch: int, images_per_step: int, learning_rate,
                    draw_bar: bool = True, board=None):
    """The run's TrainingMonitor for `--progress` (auto, bar or lines), writing TensorBoard
    to model_dir/tensorboard (or to `board`, a TensorBoardLog that outlives this monitor)."""
    return TrainingMonitor(resolve_mode(progress), epochs=epochs,
                           steps_per_epoch=steps_per_epoch, images_per_step=images_per_step,
                           log_every=log_every,
                           board=board or tensorboard_log.TensorBoardLog(model_dir),
                           learning_rate=learning_rate, show=runtime.is_chief(),
                           draw_bar=draw_bar)


class TrainingMonitor:
    """Progress display and step-level TensorBoard scalars for one run.

    Every rank calls every method at the same steps: the --log_every points
    reach TensorBoard through runtime.on_chief, a collective. Only `show`
    (rank 0) prints.
    """

    def __init__(self, mode: str, *, epochs: int, steps_per_epoch: int, images_per_step: int,
                 log_every: int, board, learning_rate, show: bool, draw_bar: bool = True):
        """`mode`: bar or lines (see resolve_mode); `board`: a TensorBoardLog;
        `learning_rate`: returns the rate of the latest step; `draw_bar`: False
        where something else draws the bar (Keras fit's own)."""
        self.mode, self.epochs, self.steps = mode, epochs, steps_per_epoch
        self.log_every, self.board, self.learning_rate = log_every, board, learning_rate
        self.show, self.draw_bar = show, draw_bar
        self.window = LogWindow(images_per_step)
        self.images_per_step = images_per_step
        self._bar = None

    def start_epoch(self, epoch: int, *, steps: int | None = None, done_steps: int = 0,
                    steps_before: int | None = None) -> None:
        """Before the epoch's first step, or (elastic) its first step since a restart.

        `steps`: the epoch's steps (default: the run's steps per epoch); `done_steps`:
        how many of them are already done; `steps_before`: the run's steps before this
        epoch, TensorBoard's step axis (default: full epochs of `steps_per_epoch`).
        """
        self.epoch, self.epoch_steps, self.done_steps = epoch, steps or self.steps, done_steps
        self.steps_before = ((epoch - 1) * self.steps if steps_before is None else steps_before)
        self.window.restart(done_steps)
        self._epoch_start = self._last_draw = time.perf_counter()
        if self.show and self.mode == "bar" and self.draw_bar:
            # Drawn only when step_done says so (never by tqdm's own timing), so the loss is
            # read only for a redraw.
            self._bar = tqdm.tqdm(total=self.epoch_steps, initial=done_steps,
                                  desc=f"epoch {epoch}/{self.epochs}",
                                  unit="step", file=sys.stdout, leave=True, mininterval=0,
                                  ncols=bar_size()[0], nrows=bar_size()[1],
                                  bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| "
                                             "{elapsed}<{remaining}{postfix}")

    def step_done(self, step: int, loss_sum) -> None:
        """After step `step` (from 1) of the epoch; `loss_sum()` is the sum of the
        losses since start_epoch, called only when a value is shown or logged."""
        now = time.perf_counter()
        if self._bar is not None and (step >= self.epoch_steps
                                      or now - self._last_draw >= BAR_REDRAW_SECONDS):
            self._last_draw = now
            done = step - self.done_steps
            images_per_second = timing.images_per_second(done * self.images_per_step,
                                                         now - self._epoch_start)
            self._bar.n = step
            self._bar.set_postfix_str(f"loss {loss_sum() / done:.4f}, "
                                      f"{images_per_second:.0f} images/s", refresh=False)
            self._bar.refresh()
            if step >= self.epoch_steps:
                self._bar.close()  # the final bar stays, on its own line
                self._bar = None
            else:
                # horovodrun forwards a worker's output up to each \r or \n; tqdm starts a
                # redraw with \r and ends it with neither, which would show it one redraw late.
                sys.stdout.write("\r")
                sys.stdout.flush()
        if self.log_every and step % self.log_every == 0:
            loss, images_per_second = self.window.close(step, loss_sum())
            run_step = self.steps_before + step
            if self.show and self.mode == "lines":
                print(f"epoch {self.epoch}/{self.epochs} step {step}/{self.epoch_steps}: loss "
                      f"{loss:.4f}, {images_per_second:.0f} images/s", flush=True)
            self.board.train_window(run_step, loss=loss, learning_rate=self.learning_rate(),
                                    images_per_second=images_per_second)

    def end_epoch(self, record: dict) -> None:
        """After the epoch's evaluation; `record` as records.epoch_record makes it."""
        self.board.epoch(record, self.learning_rate())

    def close(self) -> None:
        self.board.close()
