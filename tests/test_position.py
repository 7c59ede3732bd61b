"""Where a run is and when it stops or saves mid-epoch: positions, the step and minute
triggers, and the decision every rank takes from the agreed requests (no Horovod here:
the agreed values are given)."""

import numpy as np
import pytest

from hvd_mnist.outputs import position as position_lib
from hvd_mnist.outputs.position import Position
from hvd_mnist.training import preemption


@pytest.mark.parametrize("epoch,step,first_epoch,first_step,run_steps", [
    (1, 1, 1, 2, 1),  # after the first step: the second comes next
    (2, 3, 2, 4, 8),  # mid-epoch: the next step of the same epoch
    (2, 5, 2, 6, 10),  # after the epoch's last step: no step left, only its evaluation
])
def test_a_checkpoint_after_step_s_resumes_at_step_s_plus_1(epoch, step, first_epoch,
                                                            first_step, run_steps):
    where = position_lib.after_step(epoch, step)
    assert (where.first_epoch, where.first_step) == (first_epoch, first_step)
    assert where.run_steps(steps_per_epoch=5) == run_steps
    assert where.mid_epoch


def test_an_epoch_checkpoint_resumes_at_the_next_epochs_first_step():
    assert (Position(3).first_epoch, Position(3).first_step, Position(3).mid_epoch) == (4, 1, False)
    assert Position().first_epoch == 1  # nothing restored


def test_the_newest_position_wins_whatever_its_kind():
    epoch_2, mid_epoch_2 = Position(2), position_lib.after_step(epoch=2, step=4)
    assert Position(1) < mid_epoch_2 < epoch_2  # a mid-epoch checkpoint its epoch end outran
    assert position_lib.after_step(epoch=3, step=1) > epoch_2


def test_positions_say_where_they_are():
    assert Position(2).describe(5) == "after epoch 2"
    assert position_lib.after_step(2, 4).describe(5) == "after step 4 of 5 of epoch 2"


@pytest.mark.parametrize("every,due_at", [
    (4, [(1, 4), (2, 3), (3, 2)]),  # counted over the run; never at an epoch's last step
    (5, []),  # every epoch end: the epoch checkpoints already are those
    (0, []),
])
def test_every_n_steps_is_due_at_run_steps_n_2n_but_not_at_epoch_ends(every, due_at):
    due = [(epoch, step) for epoch in (1, 2, 3) for step in range(1, 6)
           if preemption.every_steps_due(epoch, step, steps_per_epoch=5, every=every)]
    assert due == due_at


class FakeClock:
    def __init__(self):
        self.seconds = 1000.0

    def __call__(self):
        return self.seconds


def test_the_minutes_trigger_fires_once_per_interval_and_restarts_at_each_checkpoint():
    clock = FakeClock()
    trigger = preemption.MinutesTrigger(2, clock=clock)
    clock.seconds += 119
    assert not trigger.fire()
    clock.seconds += 1
    assert trigger.fire() and not trigger.fire()  # once, then 2 minutes from now
    clock.seconds += 100
    trigger.restart()  # an epoch checkpoint
    clock.seconds += 100
    assert not trigger.fire()
    assert not preemption.MinutesTrigger(0, clock=clock).fire()  # off


class Requests:
    """The variable the step allreduces, as the host sets it."""

    def __init__(self):
        self.assigned = []

    def assign(self, value):
        self.assigned.append(list(value))


class Agreed:
    def __init__(self, stop=0.0, checkpoint=0.0):
        self._values = np.array([stop, checkpoint])

    def numpy(self):
        return self._values


def control(signals=None, minutes=None, is_chief=True, every_steps=0, passes=1):
    return preemption.StepControl(
        Requests(), signals or preemption.StopSignals(),
        minutes or preemption.MinutesTrigger(0), is_chief=is_chief, steps_per_epoch=5,
        every_steps=every_steps, passes_per_update=passes)


def run_epoch(step_control, agreed_at, epoch=1, first_step=1):
    """Decisions after each step and at the epoch end, given each step's agreed requests."""
    decisions = {}
    for step in range(first_step, 6):
        step_control.before_step()
        decision = step_control.after_step(epoch, step, agreed_at.get(step, Agreed()))
        if decision.save:
            decisions[step] = decision
    end = step_control.at_epoch_end(epoch)
    if end.save:
        decisions["end"] = end
    return decisions


def test_a_stop_agreed_in_step_t_is_acted_on_after_step_t_plus_1_by_every_rank():
    assert run_epoch(control(), {2: Agreed(stop=0.5)}) == {3: (True, True)}


def test_a_stop_agreed_in_the_last_step_saves_at_the_epoch_end():
    assert run_epoch(control(), {5: Agreed(stop=0.5)}) == {"end": (True, True)}


def test_a_stop_agreed_in_the_step_before_last_saves_at_the_epoch_end_once():
    assert run_epoch(control(), {4: Agreed(stop=1.0)}) == {"end": (True, True)}


def test_a_checkpoint_request_at_an_epoch_end_is_left_to_the_epoch_checkpoint():
    assert run_epoch(control(), {4: Agreed(checkpoint=0.5)}) == {}
    assert run_epoch(control(), {1: Agreed(checkpoint=0.5)}) == {2: (True, False)}


def test_decisions_wait_for_a_whole_update_with_gradient_accumulation():
    assert run_epoch(control(passes=2), {1: Agreed(stop=0.5)}) == {2: (True, True)}
    assert run_epoch(control(passes=2), {2: Agreed(checkpoint=0.5)}) == {4: (True, False)}


def test_every_n_steps_saves_on_every_rank_without_a_request():
    assert run_epoch(control(every_steps=2), {}) == {2: (True, False), 4: (True, False)}
    assert run_epoch(control(every_steps=4), {}, epoch=2) == {3: (True, False)}


def test_a_signal_becomes_this_ranks_stop_request_and_is_sent_once():
    signals = preemption.StopSignals()
    step_control = control(signals=signals)
    step_control.before_step()
    signals.received = "SIGTERM"
    step_control.before_step()
    step_control.before_step()
    assert step_control.requests.assigned == [[1.0, 0.0]]


def test_only_rank_0s_clock_asks_for_a_checkpoint_and_only_in_one_step():
    clock = FakeClock()
    chief = control(minutes=preemption.MinutesTrigger(1, clock=clock))
    other = control(minutes=preemption.MinutesTrigger(1, clock=clock), is_chief=False)
    clock.seconds += 60
    for step_control in (chief, other):
        step_control.before_step()
        step_control.before_step()
    assert chief.requests.assigned == [[0.0, 1.0], [0.0, 0.0]]
    assert other.requests.assigned == []
