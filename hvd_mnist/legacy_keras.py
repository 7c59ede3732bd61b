"""Keras 2 on every supported TensorFlow, and a refusal to train on Keras 3.

Horovod 0.28.1, its last release, predates Keras 3. From TensorFlow 2.16 on,
`tf.keras` is Keras 3 unless the tf-keras package is installed and
TF_USE_LEGACY_KERAS=1 is set when tf.keras is first used (TensorFlow reads it
then, lazily; setting it before TensorFlow is imported is the safe rule). On Keras 3,
DistributedGradientTape and BroadcastGlobalVariablesCallback fail on `.ref`,
and, worse, hvd.DistributedOptimizer wraps the optimizer, fit() runs, and the
gradients are never averaged: the ranks silently train different models.

So importing hvd_mnist (its __init__ imports this module first, before anything
imports TensorFlow) sets TF_USE_LEGACY_KERAS=1 when the installed `keras` is
Keras 3, unless the variable is already set; child processes inherit it. A value
the user set is kept, and `require_keras2()` then refuses to start on Keras 3 with
one line saying what to install or set. TensorFlow 2.15's tf.keras is Keras 2
(`keras` 2.15) and the variable stays unset there: 2.15 honours it too, and would
then want tf-keras instead of its own Keras.

This module must not import TensorFlow at import time.
"""

import importlib.metadata
import importlib.util
import os

from hvd_mnist.errors import UserFacingError

VARIABLE = "TF_USE_LEGACY_KERAS"
# The values TensorFlow's own check accepts as "on".
ON_VALUES = ("1", "true", "True")


def major(version: str) -> int:
    return int(version.split(".")[0])


def keras3_installed() -> bool:
    """Whether the `keras` distribution (what TF >= 2.16 depends on) is Keras 3."""
    try:
        return major(importlib.metadata.version("keras")) >= 3
    except importlib.metadata.PackageNotFoundError:
        return False


if keras3_installed():
    os.environ.setdefault(VARIABLE, "1")


def keras2_problem(tf_version: str, keras_version, tf_keras_installed: bool,
                   legacy_setting) -> str | None:
    """Why this tf.keras cannot train with Horovod 0.28.1, or None when it can.

    keras_version is tf.keras's version, None when tf.keras cannot be imported.
    """
    if keras_version is not None and major(keras_version) < 3:
        return None
    minor = ".".join(tf_version.split(".")[:2])
    install = f"pip install 'tf-keras~={minor}.0' (make setup TF={minor} does)"
    why = "Horovod 0.28.1 does not average gradients with Keras 3"
    if keras_version is None:
        return (f"tf.keras cannot be imported: {VARIABLE}={legacy_setting} asks for tf-keras, "
                f"which is not installed; {install}. {why}")
    keras3 = f"tf.keras is Keras {keras_version} and {why}"
    if not tf_keras_installed:
        return f"{keras3}; {install} and set {VARIABLE}=1"
    if legacy_setting not in ON_VALUES:
        return f"{keras3}; set {VARIABLE}=1 (it is {legacy_setting!r}) to use tf-keras"
    return (f"{keras3} although {VARIABLE}=1: tf.keras was first used before hvd_mnist "
            f"set the variable; import hvd_mnist first or export {VARIABLE}=1")


def keras_version_of(tf) -> str:
    """The version of the Keras behind tf.keras: `keras` 2.15 on TF 2.15, `tf_keras` with
    the variable on, `keras` 3 otherwise. tf.keras itself has no __version__ on 2.15;
    its submodules' names say which package it resolved to."""
    package = tf.keras.layers.__name__.split(".")[0]
    return importlib.import_module(package).__version__


def require_keras2() -> None:
    """Raises UserFacingError unless tf.keras is Keras 2."""
    import tensorflow as tf

    try:
        keras_version = keras_version_of(tf)
    except ImportError:  # the variable is on and tf-keras is missing
        keras_version = None
    problem = keras2_problem(tf.__version__, keras_version,
                             importlib.util.find_spec("tf_keras") is not None,
                             os.environ.get(VARIABLE))
    if problem:
        raise UserFacingError(problem)
