"""TFDS's own MNIST builder, fed from local IDX files instead of the network.

The official builder verifies the registered checksums of the original .gz
downloads, which regenerated files can never match, so `manual_dir` cannot be
used. This subclass keeps the builder's name, version, features and example
generator and changes only where `_split_generators` finds the files; the
result is read back by the registered builder via `tfds.load("mnist")`.
"""

import os

import tensorflow_datasets as tfds
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from hvd_mnist.data import idx
from hvd_mnist.worker import quiet


class LocalMnist(tfds_mnist.MNIST, skip_registration=True):
    name = "mnist"  # the official name, so tfds.load("mnist") finds what we write

    def __init__(self, *, idx_dir: str, split_sizes: dict, **kwargs):
        self._idx_dir = idx_dir
        self._split_sizes = split_sizes
        super().__init__(**kwargs)

    def _split_generators(self, dl_manager):
        compressed = {key: os.path.join(self._idx_dir, name) for key, name in idx.FILENAMES.items()}
        # extract() gunzips local files; nothing is downloaded.
        files = dl_manager.extract(compressed)
        return [
            tfds.core.SplitGenerator(
                name=split,
                gen_kwargs=dict(num_examples=self._split_sizes[split],
                                data_path=files[f"{split}_data"],
                                label_path=files[f"{split}_labels"]))
            for split in ("train", "test")
        ]


def build(idx_dir: str, data_dir: str, split_sizes: dict, num_shards: int = 1,
          overwrite: bool = False) -> str:
    """Writes each split as `num_shards` record files (--input=files reads them per rank);
    a dataset already in data_dir is kept unless `overwrite`."""
    tfds.disable_progress_bar()
    builder = LocalMnist(idx_dir=idx_dir, split_sizes=split_sizes, data_dir=data_dir)
    mode = (tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS if overwrite else
            tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS)
    with quiet.tfds_prints():  # "Downloading ..." would be wrong here: nothing is downloaded
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
            try_download_gcs=False, num_shards=num_shards, download_mode=mode))
    return builder.data_dir
