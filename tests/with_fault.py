"""Test-only launcher: runs hvd_mnist.main with one fault injected, chosen by environment.

HVD_MNIST_TEST_FAULT=
  kill_before_step:R:N  rank R SIGKILLs itself just before its N-th training step
                        (counted from 1 in this process)
  wait_before_step:N    every rank, just before its N-th training step, creates
                        $HVD_MNIST_TEST_GO_FILE.waiting<rank> and waits until the test
                        creates $HVD_MNIST_TEST_GO_FILE (a run held still mid-epoch)
  wait_for_signal_before_step:N[:R]
                        every rank (or rank R only), just before its N-th training step,
                        writes its pid to $HVD_MNIST_TEST_GO_FILE.waiting<rank> and waits
                        until it has received SIGTERM or SIGINT (a run stopped at a known
                        step)
  kill_in_save:E        rank 0 SIGKILLs itself while saving checkpoint E: after its
                        data files are written, before the `checkpoint` file names it
                        (once: a later save of E, by an elastic job's next rank 0, goes on)
  unwritable_before_save:E
                        rank 0 makes model_dir/checkpoints unwritable just before saving
                        checkpoint E, as an administrator's chmod (or, for root, whom
                        permissions do not stop, `chattr +i`) would mid-run
  kill_in_commit:R:N     (--elastic) rank R SIGKILLs itself in its N-th commit of training
                        state, after copying the state, before the collective host check
  slow_until_size:S:MS  every rank sleeps MS milliseconds before each step while the job
                        has not S workers, so a test can grow or shrink an elastic job
                        mid-run on a tiny dataset (S=0: every step of any run is slow)
A real kill, not an exception, so nothing gets to clean up; the product has no such hook.
The run starts through tests/with_aids.py, so the testing aids' flags work here too.
"""

import os
import signal
import subprocess
import time

import with_aids  # first: this checkout's hvd_mnist, TensorFlow quiet

import horovod.tensorflow as hvd  # noqa: E402
from tensorflow.python.checkpoint import checkpoint_management  # noqa: E402

from hvd_mnist.outputs import checkpoint  # noqa: E402
from hvd_mnist.training import elastic, hooks, preemption, step as step_lib  # noqa: E402


def kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def before_step(step_number, action):
    """Runs action() in every rank just before its step_number-th training step."""
    make_train_step = step_lib.make_train_step

    def make_interrupted_train_step(*args, **kwargs):
        train_step = make_train_step(*args, **kwargs)
        calls = [0]

        def interrupted_train_step(images, labels):
            calls[0] += 1
            if calls[0] == step_number:
                action()
            return train_step(images, labels)

        interrupted_train_step.experimental_get_tracing_count = \
            train_step.experimental_get_tracing_count
        return interrupted_train_step

    step_lib.make_train_step = make_interrupted_train_step


def kill_before_step(rank, step_number):
    before_step(step_number, lambda: kill_self() if hvd.rank() == rank else None)


def wait_before_step(step_number, until=None, rank=-1):
    go_file = os.environ["HVD_MNIST_TEST_GO_FILE"]
    until = until or (lambda: os.path.exists(go_file))

    def wait():
        if rank not in (-1, hvd.rank()):
            return
        with open(f"{go_file}.waiting{hvd.rank()}", "w") as f:
            f.write(str(os.getpid()))
        while not until():
            time.sleep(0.1)  # a signal's handler runs in here

    before_step(step_number, wait)


def wait_for_signal_before_step(step_number, rank=-1):
    installed = []
    install = preemption.StopSignals.install

    def remembering_install(signals):
        installed.append(signals)
        return install(signals)

    preemption.StopSignals.install = remembering_install
    wait_before_step(step_number, until=lambda: installed[0].received, rank=rank)


def kill_in_save(epoch):
    update_state = checkpoint_management.update_checkpoint_state_internal

    def killing_update_state(save_dir, model_checkpoint_path, *args, **kwargs):
        killed_once = model_checkpoint_path + ".killed"  # an elastic job's next rank 0 saves it
        if model_checkpoint_path.endswith(f"ckpt-{epoch}") and not os.path.exists(killed_once):
            assert os.path.exists(model_checkpoint_path + ".index")  # the data is written
            open(killed_once, "w").close()
            kill_self()
        return update_state(save_dir, model_checkpoint_path, *args, **kwargs)

    checkpoint_management.update_checkpoint_state_internal = killing_update_state


def make_unwritable(directory):
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", directory], check=True)
    else:
        os.chmod(directory, 0o555)


def unwritable_before_save(epoch):
    save = checkpoint.CheckpointStore.save

    def save_into_unwritable_directory(store, save_epoch):
        if save_epoch == epoch:
            make_unwritable(store.directory)
        return save(store, save_epoch)

    checkpoint.CheckpointStore.save = save_into_unwritable_directory


def kill_in_commit(rank, commit_number):
    calls = [0]

    def killing_commit(state):
        calls[0] += 1
        state.save()
        if calls[0] == commit_number and hvd.rank() == rank:
            kill_self()
        state.check_host_updates()

    elastic.TrainingState.commit = killing_commit


def slow_until_size(size, milliseconds):
    def sleep():
        if hvd.size() != size:
            time.sleep(milliseconds / 1000)

    start_epoch, step_done = hooks.RunHooks.start_epoch, hooks.RunHooks.step_done

    def slow_start_epoch(run_hooks, epoch):
        start_epoch(run_hooks, epoch)
        sleep()  # before the first step

    def slow_step_done(run_hooks, step, loss_sum):
        step_done(run_hooks, step, loss_sum)
        sleep()

    hooks.RunHooks.start_epoch = slow_start_epoch
    hooks.RunHooks.step_done = slow_step_done


if __name__ == "__main__":
    kind, *numbers = os.environ["HVD_MNIST_TEST_FAULT"].split(":")
    {"kill_before_step": kill_before_step, "wait_before_step": wait_before_step,
     "wait_for_signal_before_step": wait_for_signal_before_step,
     "kill_in_save": kill_in_save,
     "unwritable_before_save": unwritable_before_save, "kill_in_commit": kill_in_commit,
     "slow_until_size": slow_until_size}[kind](*map(int, numbers))
    with_aids.run()
