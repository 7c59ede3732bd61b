"""Classifies digits with a model exported by a training run (hvd_mnist/outputs/export.py).

    python -m hvd_mnist.predict --model=runs/mnist/export FILE...
    python -m hvd_mnist.predict --model=runs/mnist/export --test_split [--data_dir=data/tfds]

A FILE is either an image of one digit (PNG; JPEG, GIF and BMP work too), of any
size, or an IDX image file (MNIST's format, gzip-compressed or not; `--labels` names
its IDX label file). Prints one line per image, `NAME: DIGIT (PROBABILITY%)`, with
`label L` and `wrong` where the label is known, then the accuracy over the labelled
images. A bad input is one line (`hvd_mnist: error: ...`) and exit status 1.

An image becomes an MNIST digit the way NIST's scans were made into MNIST (LeCun
et al.): grayscale (transparent pixels count as white paper); inverted when its
border is mostly light, so the digit is light on black; the border's level
subtracted as background; cropped to the bounding box of the pixels with at least
20% of the darkest-to-lightest range; resized with antialiasing so that its longer
side is 20 pixels, keeping its aspect ratio; placed in a 28x28 field with its
centre of mass at the centre. IDX and test-split images are MNIST already and go
in unchanged.
"""

import json
import os
import sys

from hvd_mnist.worker import quiet

quiet.before_tensorflow()

from absl import app, flags  # noqa: E402
import numpy as np  # noqa: E402

from hvd_mnist.data import mnist  # noqa: E402
from hvd_mnist.errors import UserFacingError, short_reason  # noqa: E402

FLAGS = flags.FLAGS
BATCH_SIZE = 500
DIGIT_BOX = 20  # MNIST's digits fit a 20x20 box inside the 28x28 field
FIELD = mnist.IMAGE_SIDE
INK_THRESHOLD = 0.2  # fraction of the image's contrast that counts as part of the digit


def define_flags():
    flags.DEFINE_string("model", None, "Directory of an exported model (model_dir/export).")
    flags.DEFINE_bool("test_split", False, "Classify the prepared TFDS test split (10,000 "
                      "images, with labels).")
    flags.DEFINE_string("data_dir", "data/tfds", "TFDS data_dir for --test_split.")
    flags.DEFINE_string("labels", "", "IDX label file for the IDX image FILE given.")
    flags.mark_flag_as_required("model")


# ---------------------------------------------------------------- the model

def load_model(directory: str):
    """The serving function of an hvd_mnist export; UserFacingError for anything else."""
    from hvd_mnist.outputs import export
    marker = os.path.join(directory, export.MARKER)
    if not os.path.isdir(directory):
        raise UserFacingError(f"--model={directory}: no such directory; pass model_dir/export "
                              "of a finished training run")
    if not os.path.isfile(marker):
        raise UserFacingError(f"--model={directory} is not a model exported by hvd_mnist (no "
                              f"{export.MARKER}); pass model_dir/export of a finished training "
                              "run")
    try:
        with open(marker) as f:
            version = json.load(f).get("format_version")
        if version != export.FORMAT_VERSION:
            raise ValueError(f"format_version {version}, expected {export.FORMAT_VERSION}")
        import tensorflow as tf
        return tf.saved_model.load(directory).signatures["serving_default"]
    except Exception as e:  # any damage to the files means the same to the user
        raise UserFacingError(f"--model={directory}: cannot load the exported model "
                              f"({short_reason(e)}); export it again by training") from None


def classify(serve, images: np.ndarray) -> np.ndarray:
    """Probabilities (n, 10) for uint8 images (n, 28, 28), in batches."""
    import tensorflow as tf
    batches = [serve(images=tf.constant(images[i:i + BATCH_SIZE]))["probabilities"].numpy()
               for i in range(0, len(images), BATCH_SIZE)]
    return np.concatenate(batches) if batches else np.zeros((0, mnist.NUM_CLASSES), np.float32)


# ---------------------------------------------------------------- inputs

def is_idx(path: str) -> bool:
    """IDX files start with two zero bytes (gzip with 1f 8b); images never do."""
    with open(path, "rb") as f:
        head = f.read(2)
    return head in (b"\0\0", b"\x1f\x8b")


def read_file(path: str):
    """[(name, uint8 28x28 image)] and labels (or None) of one FILE argument."""
    from hvd_mnist.data import idx
    if not os.path.isfile(path):
        raise UserFacingError(f"{path}: no such file")
    if os.path.getsize(path) == 0:
        raise UserFacingError(f"{path}: empty file")
    if is_idx(path):
        images = idx.read_images(path)
        return [(f"{path}[{i}]", image) for i, image in enumerate(images)]
    return [(path, mnist_like(decode_image(path), path))]


def decode_image(path: str) -> np.ndarray:
    """Grayscale in [0, 1], shape (height, width); transparency over white paper."""
    import tensorflow as tf
    with open(path, "rb") as f:
        encoded = f.read()
    try:
        pixels = tf.io.decode_image(encoded, expand_animations=False, dtype=tf.float32)
    except (tf.errors.OpError, ValueError) as e:
        raise UserFacingError(f"{path}: not a PNG, JPEG, GIF or BMP image, nor an IDX image "
                              f"file ({short_reason(e)})") from None
    channels = pixels.shape[-1]
    if channels in (2, 4):  # the last channel is alpha
        colour, alpha = pixels[..., :-1], pixels[..., -1:]
        pixels = colour * alpha + (1.0 - alpha)
    if pixels.shape[-1] == 3:
        pixels = tf.image.rgb_to_grayscale(pixels)
    return pixels[..., 0].numpy()


def mnist_like(gray: np.ndarray, name: str = "image") -> np.ndarray:
    """uint8 (28, 28), light digit on black, from a grayscale picture in [0, 1]."""
    import tensorflow as tf
    border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    if np.median(border) > 0.5:
        gray, border = 1.0 - gray, 1.0 - border
    ink = np.clip(gray - np.median(border), 0.0, None)
    if ink.max() < 0.1:
        raise UserFacingError(f"{name}: no digit found (the image has almost no contrast)")
    ink = ink / ink.max()
    rows, cols = np.nonzero(ink >= INK_THRESHOLD)
    crop = ink[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    scale = DIGIT_BOX / max(crop.shape)
    size = [max(1, round(side * scale)) for side in crop.shape]
    digit = tf.image.resize(crop[..., np.newaxis], size, antialias=True)[..., 0].numpy()
    digit = np.clip(digit, 0.0, 1.0)
    field = np.zeros((FIELD, FIELD), np.float32)
    total = digit.sum()
    centre_row = (np.arange(digit.shape[0]) * digit.sum(axis=1)).sum() / total
    centre_col = (np.arange(digit.shape[1]) * digit.sum(axis=0)).sum() / total
    top = int(np.clip(round((FIELD - 1) / 2 - centre_row), 0, FIELD - digit.shape[0]))
    left = int(np.clip(round((FIELD - 1) / 2 - centre_col), 0, FIELD - digit.shape[1]))
    field[top:top + digit.shape[0], left:left + digit.shape[1]] = digit
    return np.round(field * 255).astype(np.uint8)


def test_split(data_dir: str):
    from hvd_mnist.data import splits
    split = splits.load_split(data_dir, "test")
    names = [f"test[{i}]" for i in range(len(split))]
    return names, split.images[..., 0], split.labels


def gather_inputs(paths, labels_path: str, use_test_split: bool, data_dir: str):
    """(names, uint8 images (n, 28, 28), labels (n,) or None) of everything to classify."""
    if use_test_split:
        if paths or labels_path:
            raise UserFacingError("--test_split takes no FILE arguments and no --labels")
        return test_split(data_dir)
    if not paths:
        raise UserFacingError("nothing to classify: give image or IDX files, or --test_split")
    named = [item for path in paths for item in read_file(path)]
    names, images = [n for n, _ in named], np.stack([image for _, image in named])
    labels = None
    if labels_path:
        from hvd_mnist.data import idx
        if len(paths) != 1 or not is_idx(paths[0]):
            raise UserFacingError("--labels goes with exactly one IDX image file")
        labels = idx.read_labels(labels_path).astype(np.int64)
        if len(labels) != len(images):
            raise UserFacingError(f"{paths[0]} has {len(images)} images but {labels_path} has "
                                  f"{len(labels)} labels")
    return names, images, labels


# ---------------------------------------------------------------- output

def report_lines(names, probabilities: np.ndarray, labels=None):
    """One line per image, then the accuracy when labels are known."""
    digits = probabilities.argmax(axis=1)
    for i, name in enumerate(names):
        line = f"{name}: {digits[i]} ({100 * probabilities[i, digits[i]]:.1f}%)"
        if labels is not None:
            line += f" label {labels[i]}" + ("" if digits[i] == labels[i] else " wrong")
        yield line
    if labels is not None:
        correct = int((digits == labels).sum())
        yield (f"accuracy: {100 * correct / len(labels):.2f}% ({correct} of {len(labels)} "
               "images)")


def main(argv):
    quiet.after_flags()
    try:
        serve = load_model(FLAGS.model)
        names, images, labels = gather_inputs(argv[1:], FLAGS.labels, FLAGS.test_split,
                                              FLAGS.data_dir)
        probabilities = classify(serve, images)
    except UserFacingError as e:
        print(f"hvd_mnist: error: {e}", file=sys.stderr, flush=True)
        return 1
    for line in report_lines(names, probabilities, labels):
        print(line)
    return 0


def run():
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
