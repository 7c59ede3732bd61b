"""Stopping or checkpointing mid-epoch at a step every rank agrees on.

Three things ask for it: SIGTERM or SIGINT (preemption), `--checkpoint_every_steps`
and `--checkpoint_every_minutes`. A signal only sets a flag in the process that got
it, and the minutes are rank 0's clock; so each step carries every rank's requests,
[stop, checkpoint], inside the loss's allreduce (communication.average_loss), averaged:
above 0 means some rank asked. No collective is added, and the host reads a step's
agreed requests one step later, as it reads the loss (step.DeferredLossCheck): every
rank sees the same values, so every rank stops or saves after the same step, and no
rank is left waiting in a collective for one that left.
"""

import os
import signal
import sys
import threading
import time
import typing

from hvd_mnist.outputs import position as position_lib

# TensorFlow and Horovod are imported where used: main.py imports this module for
# Stopped before anything loads TensorFlow.

# EX_TEMPFAIL (sysexits.h): not finished, nothing wrong, run it again. Distinct from 143
# (128 + SIGTERM), which a worker killed by SIGTERM without saving reports.
EXIT_STATUS = 75
STOP, CHECKPOINT = 0, 1  # indices of a step's requests


class Stopped(Exception):
    """Every rank stopped after the same step and rank 0 saved it; main.py exits EXIT_STATUS."""


def exit_at_once() -> None:
    """Exits EXIT_STATUS now, skipping the interpreter's teardown.

    horovodrun SIGKILLs a worker 5 s after passing on its SIGTERM, and the teardown of
    TensorFlow and Horovod alone took 4 s of that here (2 cores, loaded), after a stop
    and a save that took 0.3 s. Everything the run keeps is written by then: the
    checkpoint, TensorBoard's events (closed), model_dir's lock (released), the output.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


class StopSignals:
    """SIGTERM and SIGINT set a flag; the run stops at the next step all ranks agree on."""

    def __init__(self):
        self.received = ""  # the first signal's name
        self._previous = {}

    def install(self) -> "StopSignals":
        # Python allows handlers in the main thread only (an in-process test may train elsewhere).
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: now, not at the agreed step
        # Further SIGTERMs change nothing: horovodrun sends one to every worker again
        # when the first of them exits.
        self.received = self.received or signal.Signals(signum).name


class MinutesTrigger:
    """--checkpoint_every_minutes on one clock: fires once `minutes` have passed since it
    last fired or was restarted (at every checkpoint, so epoch checkpoints count too)."""

    def __init__(self, minutes: float, clock=time.monotonic):
        self._seconds, self._clock = minutes * 60, clock
        self.restart()

    def restart(self) -> None:
        self._since = self._clock()

    def fire(self) -> bool:
        if self._seconds <= 0 or self._clock() - self._since < self._seconds:
            return False
        self.restart()
        return True


class Decision(typing.NamedTuple):
    save: bool = False  # a mid-epoch checkpoint after this step
    stop: bool = False  # then leave (Stopped)


def every_steps_due(epoch: int, step: int, steps_per_epoch: int, every: int) -> bool:
    """--checkpoint_every_steps: a mid-epoch checkpoint after run steps every, 2 x every, ...

    Counted over the run, not the epoch, so a resumed run keeps the same rhythm. Not
    after an epoch's last step: its epoch checkpoint follows there anyway.
    """
    run_step = (epoch - 1) * steps_per_epoch + step
    return every > 0 and run_step % every == 0 and step < steps_per_epoch


class StepControl:
    """This rank's requests into each step, and what all ranks decide after it.

    `requests` is the variable the step allreduces (communication.average_loss). A
    decision waits for an update boundary (`passes_per_update`): accumulated gradients
    are not in a checkpoint. `save(epoch, step, loss_sum, stop)` writes the checkpoint
    (on rank 0) and raises Stopped when `stop`.
    """

    def __init__(self, requests, signals: StopSignals, minutes: MinutesTrigger, *,
                 is_chief: bool, steps_per_epoch: int, every_steps: int = 0,
                 passes_per_update: int = 1, save=None):
        self.requests, self.signals, self.minutes = requests, signals, minutes
        self.save = save
        self._is_chief, self._steps, self._every = is_chief, steps_per_epoch, every_steps
        self._passes = passes_per_update
        self._sent = [0.0, 0.0]
        self._previous = None  # the last step's agreed requests, not yet read
        self._pending = [False, False]

    def before_step(self) -> None:
        wanted = [0.0, 0.0]
        wanted[STOP] = 1.0 if self.signals.received else 0.0
        # A pulse: asked in one step only, so it makes one checkpoint.
        wanted[CHECKPOINT] = 1.0 if self._is_chief and self.minutes.fire() else 0.0
        if wanted != self._sent:  # an assign only when something changes
            self.requests.assign(wanted)
            self._sent = wanted

    def after_step(self, epoch: int, step: int, agreed) -> Decision:
        """`agreed`: this step's averaged requests. Decides after `step` from the step
        before's, except after an epoch's last step: that waits for `at_epoch_end`."""
        earlier, self._previous = self._previous, agreed
        self._take(earlier)
        if step == self._steps:
            return Decision()
        return self._decide(epoch, step)

    def at_epoch_end(self, epoch: int) -> Decision:
        """After the epoch's last step: its requests too; a save there only if stopping,
        since the epoch checkpoint follows otherwise."""
        last, self._previous = self._previous, None
        self._take(last)
        decision = self._decide(epoch, self._steps)
        return Decision(save=decision.stop, stop=decision.stop)

    def checkpoint_written(self) -> None:
        self.minutes.restart()

    def _take(self, agreed) -> None:
        if agreed is not None:
            values = agreed.numpy()
            self._pending = [p or bool(v > 0) for p, v in zip(self._pending, values)]

    def _decide(self, epoch: int, step: int) -> Decision:
        if step % self._passes:
            return Decision()
        due = every_steps_due(epoch, step, self._steps, self._every)
        decision = Decision(save=self._pending[CHECKPOINT] or self._pending[STOP] or due,
                            stop=self._pending[STOP])
        self._pending = [False, False]
        return decision


def control_for_run(store, signals: StopSignals, *, steps_per_epoch: int, every_steps: int,
                    every_minutes: float, passes_per_update: int) -> StepControl:
    """The custom loop's StepControl: rank 0 saves into `store` (checkpoint.CheckpointStore);
    `every_steps`, `every_minutes`: --checkpoint_every_*."""
    import tensorflow as tf

    from hvd_mnist.worker import runtime

    def save(epoch: int, step: int, loss_sum: float, stop: bool) -> None:
        where = position_lib.after_step(epoch, step)
        path = runtime.on_chief(lambda: store.save_mid_epoch(where, steps_per_epoch, loss_sum))
        control.checkpoint_written()
        described = where.describe(steps_per_epoch)
        if stop:
            raise Stopped(f"preempted ({signals.received or 'a signal to another rank'}): "
                          f"stopped {described} and saved {path}; continue with --resume")
        runtime.log(f"saved {path} ({described})")

    control = StepControl(
        tf.Variable([0.0, 0.0], trainable=False, name="requests"), signals,
        MinutesTrigger(every_minutes), is_chief=runtime.is_chief(),
        steps_per_epoch=steps_per_epoch, every_steps=every_steps,
        passes_per_update=passes_per_update, save=save)
    return control
