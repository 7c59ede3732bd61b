"""The exported model and `python -m hvd_mnist.predict`: same predictions as the trained
network, MNIST-like conversion of arbitrary images, the output format and the error lines."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import synthetic_digits
from hvd_mnist import predict
from hvd_mnist.data import splits, idx
from hvd_mnist.outputs import export
from hvd_mnist.training import model as model_lib
from hvd_mnist.errors import UserFacingError


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A freshly initialised network (its exact weights are what matters) and its export."""
    tf.keras.utils.set_random_seed(5)
    model = model_lib.build_model()
    directory = tmp_path_factory.mktemp("model") / "export"
    export.write(model, str(directory), {"mode": "custom"})
    return model, directory


def test_exported_model_predicts_what_the_trained_network_does(exported):
    model, directory = exported
    images, _ = synthetic_digits(100, seed=2)  # the tiny test split's images
    in_process = model(splits.normalize(images[..., np.newaxis], None)[0], training=False).numpy()
    served = predict.classify(predict.load_model(str(directory)), images)
    # The same weights and ops; the saved graph's fused kernels round the last bit differently.
    assert np.abs(served - in_process).max() <= 1e-6
    assert np.array_equal(served.argmax(axis=1), in_process.argmax(axis=1))


def test_export_replaces_an_older_one_only_when_complete(exported, tmp_path):
    model, _ = exported
    directory = tmp_path / "export"
    export.write(model, str(directory), {"mode": "first"})
    export.write(model, str(directory), {"mode": "second"})
    assert json.loads((directory / export.MARKER).read_text())["mode"] == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"], "temporary left behind"


def draw_seven(height, width, dark_on_light=True):
    """A thick '7' on a canvas of any size, as a scan or a drawing program would give it."""
    canvas = np.zeros((height, width), np.float32)
    top, left, bottom, right = height // 5, width // 3, 4 * height // 5, 2 * width // 3
    thick = max(2, height // 12)
    canvas[top:top + thick, left:right] = 1.0
    for row in range(top, bottom):
        col = right - 1 - (row - top) * (right - left) // (2 * (bottom - top))
        canvas[row, col - thick:col] = 1.0
    return 1.0 - canvas if dark_on_light else canvas


@pytest.mark.parametrize("height,width,dark_on_light", [(28, 28, False), (300, 200, True),
                                                         (64, 160, True)])
def test_images_become_mnist_like_digits(height, width, dark_on_light):
    digit = predict.mnist_like(draw_seven(height, width, dark_on_light))
    assert digit.shape == (28, 28) and digit.dtype == np.uint8
    rows, cols = np.nonzero(digit > 50)
    assert max(rows.max() - rows.min(), cols.max() - cols.min()) + 1 in (19, 20, 21), \
        "the longer side fills the 20x20 box"
    assert digit[0].max() == digit[-1].max() == 0, "light on black, with a margin"
    mass = digit.astype(float) / digit.sum()
    centre = ((mass.sum(axis=1) * np.arange(28)).sum(), (mass.sum(axis=0) * np.arange(28)).sum())
    assert np.allclose(centre, 13.5, atol=1.0), "centre of mass in the middle"


def test_a_blank_image_is_an_error():
    with pytest.raises(UserFacingError, match="blank.png: no digit found"):
        predict.mnist_like(np.ones((40, 40), np.float32), "blank.png")


def write_png(path, gray):
    path.write_bytes(tf.io.encode_png(tf.constant(
        np.round(gray * 255).astype(np.uint8)[..., np.newaxis])).numpy())
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    images, labels = synthetic_digits(3, seed=4)
    idx.write_images(str(root / "images-idx3-ubyte.gz"), images)
    idx.write_labels(str(root / "labels-idx1-ubyte.gz"), labels)
    (root / "raw-idx3-ubyte").write_bytes(gzip.decompress(
        (root / "images-idx3-ubyte.gz").read_bytes()))
    write_png(root / "seven.png", draw_seven(90, 60))
    (root / "empty.png").write_bytes(b"")
    (root / "notes.txt").write_text("not a picture\n")
    return root, labels


def run_predict(*args):
    return subprocess.run([sys.executable, "-m", "hvd_mnist.predict", *map(str, args)],
                          capture_output=True, text=True, timeout=180)


def test_output_is_one_line_per_image_then_the_accuracy(exported, inputs):
    _, model_dir = exported
    root, labels = inputs
    result = run_predict(f"--model={model_dir}", root / "images-idx3-ubyte.gz",
                         f"--labels={root / 'labels-idx1-ubyte.gz'}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    for i, line in enumerate(lines[:3]):
        name, digit, probability, label = predict_line(line)
        assert name == f"{root}/images-idx3-ubyte.gz[{i}]" and label == labels[i]
    correct = sum(predict_line(line)[1] == labels[i] for i, line in enumerate(lines[:3]))
    assert lines[3] == f"accuracy: {100 * correct / 3:.2f}% ({correct} of 3 images)"

    unlabelled = run_predict(f"--model={model_dir}", root / "seven.png", root / "raw-idx3-ubyte")
    assert unlabelled.returncode == 0, unlabelled.stderr
    names = [line.split(": ")[0] for line in unlabelled.stdout.splitlines()]
    assert names == [f"{root}/seven.png"] + [f"{root}/raw-idx3-ubyte[{i}]" for i in range(3)]
    assert "accuracy" not in unlabelled.stdout and "label" not in unlabelled.stdout


def predict_line(line):
    """'NAME: D (P%) label L [wrong]' -> (name, digit, probability, label)."""
    name, rest = line.rsplit(": ", 1)
    words = rest.split()
    assert words[1].startswith("(") and words[1].endswith("%)"), line
    digit, probability = int(words[0]), float(words[1][1:-2])
    assert 0 <= digit <= 9 and 0 < probability <= 100
    label = int(words[3]) if len(words) > 2 else None
    assert words[4:] == ([] if label is None or label == digit else ["wrong"]), line
    return name, digit, probability, label


@pytest.mark.parametrize("name,message", [
    ("empty.png", "{path}: empty file"),
    ("notes.txt", "{path}: not a PNG, JPEG, GIF or BMP image, nor an IDX image file"),
    ("labels-idx1-ubyte.gz", "{path}: magic number 2049, expected 2051 for IDX images"),
    ("missing.png", "{path}: no such file"),
])
def test_bad_files_are_named_with_what_is_wrong(inputs, name, message):
    path = inputs[0] / name
    with pytest.raises(UserFacingError) as error:
        predict.read_file(str(path))
    assert str(error.value).startswith(message.format(path=path))


def test_a_directory_that_is_no_export_is_named(inputs):
    root = inputs[0]
    with pytest.raises(UserFacingError, match=f"--model={root} is not a model exported by "
                                              "hvd_mnist \\(no hvd_mnist_export.json\\)"):
        predict.load_model(str(root))


@pytest.mark.parametrize("bad", ["model", "file"])
def test_bad_input_is_one_line_and_exit_1(exported, inputs, bad):
    root = inputs[0]
    model_dir = root if bad == "model" else exported[1]
    result = run_predict(f"--model={model_dir}", root / "empty.png")
    assert result.returncode == 1 and result.stdout == ""
    expected = (f"--model={root} is not a model" if bad == "model" else f"{root}/empty.png: empty file")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hvd_mnist: error: {expected}"), result.stderr
