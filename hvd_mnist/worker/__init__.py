"""One worker's set-up (a Horovod worker: one process, one rank): Horovod, devices,
threads, TensorFlow's logging, and which Keras `tf.keras` is (keras_compat.py), plus the
rank-0 helpers every side effect goes through (runtime.is_chief, runtime.on_chief).

Nothing here may import TensorFlow at package import: quiet.py and keras_compat.py
must act before it loads.
"""
