"""hvd_mnist: data-parallel TensorFlow 2 training of the Keras MNIST CNN with Horovod."""
