"""Keras 3 and Keras 2 under Horovod 0.28.1: every difference between them, in one place.

TensorFlow 2.21 (the default) brings Keras 3. TensorFlow 2.15's tf.keras is Keras 2,
and TF 2.16-2.19 get Keras 2 from the tf-keras package (make setup TF=2.16..2.19
installs it). Horovod 0.28.1 is built with this project's patches for Keras 3
(tools/horovod-patches/keras3-*.patch), so the trainers hand Horovod the model's own
variables and optimizers on both. What still differs between the two Kerases (loss
scaling, dropout streams, file formats) is here; the trainers never ask which Keras
they run on.

Where tf-keras is installed beside Keras 3, importing hvd_mnist (its __init__ imports
this module before anything imports TensorFlow) sets TF_USE_LEGACY_KERAS=1 unless the
variable is already set, so those environments keep Keras 2. TensorFlow reads the
variable when tf.keras is first used; child processes inherit it. This module must
not import TensorFlow at import time.
"""

import importlib.metadata
import importlib.util
import math
import os

from hvd_mnist.errors import UserFacingError

VARIABLE = "TF_USE_LEGACY_KERAS"
# The values TensorFlow's own check accepts as "on".
ON_VALUES = ("1", "true", "True")


def major(version: str) -> int:
    return int(version.split(".")[0])


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


if importlib.util.find_spec("tf_keras") is not None and major(
        installed_version("keras") or "0") >= 3:
    os.environ.setdefault(VARIABLE, "1")


def keras_version() -> str:
    """The version of the Keras behind tf.keras: `keras` 2.15 on TF 2.15, `tf_keras` with
    the variable on, `keras` 3 otherwise. tf.keras itself has no __version__ on 2.15;
    its submodules' names say which package it resolved to."""
    import tensorflow as tf

    package = tf.keras.layers.__name__.split(".")[0]
    return importlib.import_module(package).__version__


def is_keras3() -> bool:
    return major(keras_version()) >= 3


def check_keras() -> None:
    """Raises UserFacingError, in one line, where tf.keras cannot be imported at all."""
    import tensorflow as tf

    try:
        keras_version()
    except ImportError:
        minor = ".".join(tf.__version__.split(".")[:2])
        raise UserFacingError(
            f"tf.keras cannot be imported: {VARIABLE}={os.environ.get(VARIABLE)} asks for "
            f"tf-keras, which is not installed; unset {VARIABLE} to use the Keras TensorFlow "
            f"brings, or pip install 'tf-keras~={minor}.0'") from None


def state_variables(model, optimizer) -> list:
    """Every model and optimizer variable: rank 0's state, which every rank takes before
    step 1 (and an elastic job after every reset)."""
    return model.variables + optimizer.variables + _loss_scale_state(optimizer)


def _is_loss_scaled(optimizer) -> bool:
    return hasattr(optimizer, "inner_optimizer")  # both Kerases' LossScaleOptimizer


def _loss_scale_state(optimizer) -> list:
    """Keras 2's loss scale and its count of finite steps, which its LossScaleOptimizer
    leaves out of `variables` (Keras 3's lists them there)."""
    if not _is_loss_scaled(optimizer) or is_keras3():
        return []
    return [optimizer._loss_scale.current_loss_scale, optimizer._loss_scale.counter]


def loss_scale(optimizer) -> float | None:
    if not _is_loss_scaled(optimizer):
        return None
    return float(optimizer.dynamic_scale if is_keras3() else optimizer.loss_scale)


def unscaled_optimizer(optimizer):
    """The optimizer inside a LossScaleOptimizer (the one whose hyper-parameters count)."""
    return optimizer.inner_optimizer if _is_loss_scaled(optimizer) else optimizer


def scale_loss(optimizer, loss):
    """The loss times the loss scale (the loss itself without loss scaling), inside the tape.
    Keras 3's optimizers all have scale_loss, the identity unless loss-scaled."""
    if is_keras3():
        return optimizer.scale_loss(loss)
    return optimizer.get_scaled_loss(loss) if _is_loss_scaled(optimizer) else loss


def unscale_gradients(optimizer, gradients):
    """Keras 2's LossScaleOptimizer leaves the unscaling to its caller, as its own
    minimize() does; Keras 3's does it in apply_gradients, after its finiteness check."""
    if is_keras3() or not _is_loss_scaled(optimizer):
        return gradients
    return optimizer.get_unscaled_gradients(gradients)


def dropout_layer(rate: float, dtype):
    """A Dropout layer whose random stream `reseed_dropout` can restart.

    Keras 2's default dropout draws from stateful kernels whose position lives in
    TF's runtime, out of reach of a checkpoint: "stateful" gives each layer its own
    tf.random.Generator instead. Keras 3's draws from a seed variable of the layer's own.
    """
    import tensorflow as tf

    if is_keras3():
        return tf.keras.layers.Dropout(rate, dtype=dtype)
    return tf.keras.layers.Dropout(rate, rng_type="stateful", dtype=dtype)


def reseed_dropout(layer, seed: int, draws: int = 0, batch_size: int = 0) -> None:
    """Restarts one Dropout layer's random stream from `seed`, then moves it past `draws`
    masks of `batch_size` examples (one per training call), to where a run that drew them
    would be. Keras keeps no public handle on the stream: Keras 3's `seed_generator`,
    whose state is [seed, masks drawn] (each draw adds [0, 1]); Keras 2's
    `_random_generator`, whose tf.random.Generator draws one number per element of the
    mask (tf.nn.experimental.general_dropout), so the mask's size says how far to skip."""
    if is_keras3():
        if layer.rate > 0:  # Keras 3 gives a rate-0 layer no stream at all
            layer.seed_generator.state.assign([seed, draws])
        return
    rng = layer._random_generator
    rng._maybe_init()  # no-op once the layer is built
    rng._generator.reset_from_seed(seed)
    if draws and layer.rate > 0:  # Keras 2 draws no mask at rate 0
        if not batch_size:
            raise ValueError("Keras 2 needs the batch size to move a dropout stream on")
        mask_elements = batch_size * math.prod(layer.input_shape[1:])
        # Generator.skip(n) leaves the stream where drawing n numbers would.
        rng._generator.skip(draws * mask_elements)


def loss_scaled(wrap_distributed, optimizer):
    """`wrap_distributed(optimizer)` (Horovod's DistributedOptimizer) with a
    LossScaleOptimizer, ordered so that its check for non-finite gradients sees them
    averaged over ranks and every rank skips the same steps: Keras 3's goes inside
    Horovod's, which averages in its apply(); Keras 2's outside, since it asks the
    optimizer inside it for the gradients, which Horovod's averages."""
    import tensorflow as tf

    if is_keras3():
        return wrap_distributed(tf.keras.mixed_precision.LossScaleOptimizer(optimizer))
    return tf.keras.mixed_precision.LossScaleOptimizer(wrap_distributed(optimizer))


def dropout_streams(model) -> list:
    """The variables that hold the Dropout layers' random streams: each rank's own
    (reseed_dropout), so a broadcast of rank 0's state must leave them alone. Keras 3
    keeps them in each layer's seed generator; Keras 2's stateful generators keep theirs
    outside the model's variables."""
    import tensorflow as tf

    if not is_keras3():
        return []
    return [layer.seed_generator.state for layer in model.layers
            if isinstance(layer, tf.keras.layers.Dropout) and layer.rate > 0]


def model_file_suffix() -> str:
    """What fit()'s per-epoch model files end in: Keras 3's own format, Keras 2's HDF5."""
    return ".keras" if is_keras3() else ".h5"
