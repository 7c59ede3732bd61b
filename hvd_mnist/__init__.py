"""hvd_mnist: data-parallel TensorFlow 2 training of the Keras MNIST CNN with Horovod."""

# First, before any module imports TensorFlow: tf-keras as tf.keras where it is installed,
# and oneDNN's kernels on every x86-64 CPU (TensorFlow reads both variables as it loads).
from hvd_mnist.worker import cpu_kernels, keras_compat  # noqa: F401
