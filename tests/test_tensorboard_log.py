"""TensorBoard event files: what is written reads back, and a failed write is one line."""

import horovod.tensorflow as hvd
import pytest

from tensorboard_events import read_scalars
from hvd_mnist.outputs import tensorboard_log
from hvd_mnist.errors import UserFacingError


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()  # one rank: on_chief runs the write here


def record(epoch):
    return {"epoch": epoch, "train_loss": 1.0 / epoch, "test_loss": 0.5 / epoch,
            "test_accuracy": 0.9 + epoch / 100, "images_per_second": 1000.0 + epoch}


def test_scalars_read_back_at_their_steps(tmp_path):
    board = tensorboard_log.TensorBoardLog(str(tmp_path))
    for run_step in (10, 20, 30):
        board.train_window(run_step, loss=run_step / 100, learning_rate=0.5,
                           images_per_second=2000.0)
    board.epoch(record(1), learning_rate=0.5)
    board.epoch(record(2), learning_rate=0.25)
    board.close()

    scalars = read_scalars(str(tmp_path / "tensorboard"))
    assert scalars["train/loss"] == [(10, pytest.approx(0.1)), (20, pytest.approx(0.2)),
                                     (30, pytest.approx(0.3))]
    assert scalars["epoch/learning_rate"] == [(1, 0.5), (2, 0.25)]
    assert scalars["epoch/test_accuracy"] == [(1, pytest.approx(0.91)), (2, pytest.approx(0.92))]
    assert sorted(scalars) == sorted(tensorboard_log.TRAIN_TAGS + tensorboard_log.EPOCH_TAGS)


def test_unwritable_directory_is_one_line(tmp_path):
    (tmp_path / "a_file").write_text("")  # even root cannot create a directory inside a file
    board = tensorboard_log.TensorBoardLog(str(tmp_path / "a_file"))
    with pytest.raises(UserFacingError) as error:
        board.epoch(record(1), learning_rate=0.5)
    message = str(error.value)
    assert message.startswith(f"cannot write {tmp_path}/a_file/tensorboard (")
    assert "\n" not in message
