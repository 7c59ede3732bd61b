"""Which errors of an elastic worker's training hvd.elastic.run turns into a reset, and that
it swallows none (tools/horovod-patches/elastic-errors-raised.patch).

Unpatched, it reset only on messages naming a Horovod op type, which TF 2.x's do not, and
returned None for any other UnknownError: the worker then exited 0 and the driver ended the
job as a success. The training function below stands in for hvd_mnist's elastic `_train`;
the state and the reset (shutdown, init) are counted instead of done."""

import horovod.tensorflow as hvd
import horovod.tensorflow.elastic as horovod_elastic
import pytest
import tensorflow as tf
from horovod.common.elastic import State

GLOO_PEER_DIED = ("{{function_node __inference_train_step_1234}} [/tmp/build/horovod-0.28.1/"
                  "third_party/compatible17_gloo/gloo/transport/tcp/pair.cc:589] Read error "
                  "[127.0.0.1]:40843: Connection reset by peer\n\t [[{{node train_loss}}]]")
HOROVOD_SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of "
                     "the ranks or an attempt to allreduce, allgather or broadcast a tensor "
                     "after one of the ranks finished execution.")
NCCL_FAILED = "ncclAllReduce failed: unhandled system error\n\t [[{{node train_loss}}]]"


class CountingState(State):
    def __init__(self):
        super().__init__(bcast_object=None, get_rank=lambda: 0)
        self.syncs = self.restores = 0

    def sync(self):
        self.syncs += 1

    def restore(self):
        self.restores += 1

    def save(self):
        pass

    def reset(self):
        pass


@pytest.fixture
def resets(monkeypatch):
    count = []
    monkeypatch.setattr(horovod_elastic, "_reset", lambda: count.append(1))
    return count


def training_that_fails_once(error):
    calls = []

    def train(state):
        calls.append(1)
        if len(calls) == 1:
            raise error
        return "trained"
    return train, calls


@pytest.mark.parametrize("message", [GLOO_PEER_DIED, HOROVOD_SHUT_DOWN, NCCL_FAILED])
def test_a_collective_failed_by_a_lost_peer_resets_and_trains_again(message, resets):
    train, calls = training_that_fails_once(tf.errors.UnknownError(None, None, message))
    state = CountingState()
    assert hvd.elastic.run(train)(state) == "trained"
    assert (len(calls), state.restores, len(resets), state.syncs) == (2, 1, 1, 2)


@pytest.mark.parametrize("error", [
    tf.errors.UnknownError(None, None, "a kernel failed"),
    tf.errors.InvalidArgumentError(None, None, "shapes differ"),
], ids=["an UnknownError from elsewhere", "another kind of error"])
def test_any_other_error_is_raised_unchanged_not_swallowed(error, resets):
    train, calls = training_that_fails_once(error)
    with pytest.raises(type(error)) as raised:
        hvd.elastic.run(train)(CountingState())
    assert raised.value is error
    assert (len(calls), len(resets)) == (1, 0)
