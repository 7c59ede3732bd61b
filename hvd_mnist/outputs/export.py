"""The trained network as a SavedModel in model_dir/export/, for serving and hvd_mnist.predict.

Its signature `serving_default` takes `images`: uint8, shape (batch, 28, 28), MNIST's
convention (0 is the background, 255 full ink: a light digit on black, as in the IDX
files and TFDS), and returns `probabilities`: float32, shape (batch, 10), one row per
image, summing to 1. Scaling to the network's [0, 1] input happens inside, exactly as
in training (splits.normalize), so a caller never scales. `hvd_mnist_export.json` next
to it says what it is and what the run reached; predict refuses a directory without it.
"""

import json
import os
import shutil

import tensorflow as tf

from hvd_mnist.data import mnist, splits
from hvd_mnist.outputs import files
from hvd_mnist.worker import runtime

DIRECTORY = "export"
MARKER = "hvd_mnist_export.json"
FORMAT_VERSION = 1
IMAGES_SPEC = tf.TensorSpec([None, mnist.IMAGE_SIDE, mnist.IMAGE_SIDE], tf.uint8, name="images")


class Serving(tf.Module):
    """The exported object: the network's variables and one serving function."""

    def __init__(self, model: tf.keras.Model):
        super().__init__(name="hvd_mnist")
        # The variables, not the Keras model, are what gets saved: saving a Keras
        # object would also trace and store every layer's call functions.
        self.weights = model.weights
        self._model = model

    @tf.function(input_signature=[IMAGES_SPEC])
    def serve(self, images):
        pixels, _ = splits.normalize(images[..., tf.newaxis], None, self._model.inputs[0].dtype)
        probabilities = self._model(pixels, training=False)
        return {"probabilities": tf.cast(probabilities, tf.float32)}  # float64: --precision=float64


def write(model: tf.keras.Model, directory: str, about: dict) -> None:
    """Writes the SavedModel and its marker into `directory`, replacing an older export
    only once the new one is complete."""
    temporary, previous = f"{directory}.tmp", f"{directory}.old"
    with files.writing(directory, also=(tf.errors.OpError,)):
        for path in (temporary, previous):
            shutil.rmtree(path, ignore_errors=True)
        serving = Serving(model)
        tf.saved_model.save(serving, temporary, signatures={"serving_default": serving.serve})
        with open(os.path.join(temporary, MARKER), "w") as f:
            json.dump({"format_version": FORMAT_VERSION, "signature": "serving_default",
                       "input": {"name": "images", "dtype": "uint8",
                                 "shape": IMAGES_SPEC.shape.as_list(),
                                 "values": "0 background .. 255 ink"},
                       "output": {"name": "probabilities", "dtype": "float32",
                                  "shape": [None, mnist.NUM_CLASSES]},
                       **about}, f, indent=2)
        if os.path.exists(directory):
            os.replace(directory, previous)
        os.replace(temporary, directory)
        shutil.rmtree(previous, ignore_errors=True)


def export_on_chief(model_dir: str, model: tf.keras.Model, summary: dict) -> str:
    """Rank 0 writes model_dir/export at the end of a run; every rank calls this."""
    directory = os.path.join(model_dir, DIRECTORY)
    about = {key: summary.get(key) for key in ("mode", "num_workers", "epochs_run",
                                               "test_accuracy", "test_examples")}
    runtime.on_chief(lambda: write(model, directory, about))
    return directory
