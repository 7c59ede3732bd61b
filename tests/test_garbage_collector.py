"""A worker runs with Python's collector off while TensorFlow loads and everything loaded
frozen out of later collections (hvd_mnist/worker/garbage_collector.py)."""

import gc
import subprocess
import sys

import pytest

from hvd_mnist.worker import garbage_collector

# main.run() up to the trainer, whose train_and_evaluate only reports the collector's state.
ENTRY_POINT_UP_TO_THE_TRAINER = """
import gc, sys
from hvd_mnist import main
from hvd_mnist.training import loop
def report(config):
    print("collector", gc.isenabled(), gc.get_freeze_count(), "tensorflow" in sys.modules)
loop.train_and_evaluate = report
sys.argv = ["hvd_mnist", "--data_dir=" + sys.argv[1], "--model_dir=" + sys.argv[2]]
main.run()
"""


@pytest.fixture
def collector_restored():
    yield
    gc.unfreeze()
    gc.enable()


def test_after_a_pause_what_is_loaded_is_frozen_and_collection_goes_on(collector_restored):
    garbage_collector.pause()
    assert not gc.isenabled()
    garbage_collector.freeze_loaded()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0


def test_without_a_pause_the_collector_is_left_as_it_was():
    frozen = gc.get_freeze_count()
    garbage_collector.freeze_loaded()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_the_trainer_starts_with_tensorflow_frozen_and_the_collector_on(tiny_data_dir,
                                                                        tmp_path):
    out = subprocess.run([sys.executable, "-c", ENTRY_POINT_UP_TO_THE_TRAINER,
                          str(tiny_data_dir), str(tmp_path / "model")],
                         capture_output=True, text=True, check=True).stdout
    enabled, frozen, tensorflow_loaded = out.split("collector ")[1].split()
    assert (enabled, tensorflow_loaded) == ("True", "True")
    # TensorFlow, Keras and Horovod alone leave about 300,000 tracked objects.
    assert int(frozen) > 100_000
