"""Which errors of an elastic worker's training become a reset, and that none is swallowed.

hvd.elastic.run resets on a HorovodInternalError and returns None for any other
TensorFlow UnknownError: the worker would then exit 0 and the driver end the job as a
success (hvd_mnist/training/elastic.py, `_reporting_lost_peers`)."""

import pytest
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError

from hvd_mnist.training import elastic

GLOO_PEER_DIED = ("{{function_node __inference_train_step_1234}} [/tmp/build/horovod-0.28.1/"
                  "third_party/compatible17_gloo/gloo/transport/tcp/pair.cc:589] Read error "
                  "[127.0.0.1]:40843: Connection reset by peer\n\t [[{{node train_loss}}]]")
HOROVOD_SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of "
                     "the ranks or an attempt to allreduce, allgather or broadcast a tensor "
                     "after one of the ranks finished execution.")


def training_that_raises(error):
    def train(state, run):
        raise error
    return elastic._reporting_lost_peers(train)


@pytest.mark.parametrize("message", [GLOO_PEER_DIED, HOROVOD_SHUT_DOWN])
def test_a_collective_failed_by_a_lost_peer_becomes_a_reset(message):
    with pytest.raises(HorovodInternalError):
        training_that_raises(tf.errors.UnknownError(None, None, message))(None, None)


def test_an_unknown_error_from_elsewhere_is_raised_where_elastic_run_cannot_swallow_it():
    with pytest.raises(RuntimeError, match="elastic: UnknownError: a kernel failed") as raised:
        training_that_raises(tf.errors.UnknownError(None, None, "a kernel failed"))(None, None)
    assert not isinstance(raised.value, tf.errors.UnknownError)


def test_other_errors_pass_unchanged():
    error = tf.errors.InvalidArgumentError(None, None, "shapes differ")
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        training_that_raises(error)(None, None)
    assert raised.value is error
