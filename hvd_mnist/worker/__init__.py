"""One worker's set-up (a Horovod worker: one process, one rank): Horovod, devices,
threads, TensorFlow's logging, which Keras `tf.keras` is (keras_compat.py) and which CPU
kernels TensorFlow runs (cpu_kernels.py), plus the rank-0 helpers every side effect goes
through (runtime.is_chief, runtime.on_chief).

Nothing here may import TensorFlow at package import: quiet.py, keras_compat.py and
cpu_kernels.py must act before it loads.
"""
