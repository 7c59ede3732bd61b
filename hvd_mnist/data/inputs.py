"""Where each rank's batches come from: `--input=memory`, `stream` or `files`.

memory  Each split is loaded once into memory (tfds.load, batch_size=-1) and batches
        are gathered by index (splits.py): the epoch's order is numpy's permutation of
        (seed, epoch), rank r takes every size-th example of each global batch.
stream  Every rank reads the TFDS record files through tf.data every epoch:
        decode -> shuffle(seed from (seed, epoch), --shuffle_buffer) -> take(steps x
        global batch) -> shard(size, rank) -> batch. Element i of the shuffled stream
        goes to rank i % size, so rank r's t-th batch is positions t*G + r + k*size of
        the stream: as in memory mode, the union of the ranks' batches at step t is one
        global batch whatever -np is, in tf.data's shuffle order instead of numpy's.
        Records are shuffled and sharded still PNG-encoded, so a rank decodes only its
        own share; memory use is the shuffle buffer of encoded records, not the split.
        Each rank reads every record.
files   Each rank reads only its own record files (TFDS ReadConfig with an
        InputContext; the split must be written as several files, see
        `prepare --num_shards`) and shuffles them from (seed, epoch, rank): a rank reads
        1/size of the bytes, but which examples share a global batch depends on -np, so
        results depend on -np too.
The test split is sharded as in memory mode (rank r: examples r, r+size, ...) in
every mode except files, where each rank evaluates its own files.
"""

import copy
import dataclasses

import tensorflow as tf

from hvd_mnist.data import mnist, splits
from hvd_mnist.errors import DataError, UserFacingError, short_reason

PREFETCH_BATCHES = 2
DECODE_THREADS = 2


@dataclasses.dataclass(frozen=True)
class Shard:
    rank: int
    size: int


class MemoryInput:
    """Both splits in memory; batches gathered by index (splits.py)."""

    def __init__(self, data_dir: str, shard: Shard, dtype=tf.float32):
        self.train_split = splits.load_split(data_dir, "train")
        self.test_split = splits.load_split(data_dir, "test")
        self.shard, self.dtype = shard, dtype
        self.num_test_examples = len(self.test_split)

    def usable_train_examples(self) -> int:
        """How many examples one epoch can draw from (all of them)."""
        return len(self.train_split)

    def for_shard(self, shard: Shard) -> "MemoryInput":
        """The same splits, batched for another rank of another number of workers."""
        other = copy.copy(self)
        other.shard = shard
        return other

    def train_batches(self, *, seed: int, epoch: int, steps: int, per_rank_batch_size: int,
                      first_step: int = 1):
        """The epoch's batches from step `first_step` on (a mid-epoch resume)."""
        indices = splits.train_epoch_indices(
            len(self.train_split), seed=seed, epoch=epoch, steps=steps,
            per_rank_batch_size=per_rank_batch_size, rank=self.shard.rank, size=self.shard.size)
        return splits.batches_from_indices(
            self.train_split, indices[(first_step - 1) * per_rank_batch_size:],
            per_rank_batch_size, self.dtype)

    def eval_batches(self, per_rank_batch_size: int):
        indices = splits.eval_indices(len(self.test_split), self.shard.rank, self.shard.size)
        return splits.batches_from_indices(self.test_split, indices, per_rank_batch_size,
                                         self.dtype)


class RecordInput:
    """The TFDS record files through tf.data (stream and files modes)."""

    def __init__(self, data_dir: str, shard: Shard, mode: str, shuffle_buffer: int,
                 dtype=tf.float32):
        import tensorflow_datasets as tfds  # slow import; only needed here

        splits.check_prepared(data_dir)
        self.data_dir, self.shard, self.mode = data_dir, shard, mode
        self.shuffle_buffer, self.dtype = shuffle_buffer, dtype
        try:
            self._builder = tfds.builder(splits.DATASET, data_dir=data_dir)
        except (tf.errors.OpError, ValueError) as e:
            raise DataError(f"cannot read the prepared {splits.DATASET} in {data_dir} "
                            f"({short_reason(e)})") from None
        self._tfds = tfds
        if mode == "files":  # fail now, not in the middle of building the pipeline
            for split in splits.SPLITS:
                self.rank_files_lengths(split, shard)
        # Every record file this rank will read, checked against make data's sha256s before
        # the first step (47 ms for MNIST's 23 MB here), so damage stops every rank with one
        # line (job.start runs this on every rank). TF's reader checks each record's CRC
        # only when the epoch reaches it, on the one rank reading that file, while the
        # others wait for it in the step's allreduce; a pass of that reader over every
        # record up front took 5.7 s.
        for split in splits.SPLITS:
            if mode == "stream":
                splits.check_record_files(data_dir, split)
            else:
                splits.check_record_files(data_dir, split, shard.rank, shard.size)
        self.num_test_examples = sum(self._shard_lengths("test"))

    def usable_train_examples(self) -> int:
        """How many examples one epoch can draw from: all of them (stream), or size times
        the fewest any rank's files hold (files), so every rank runs the same steps."""
        if self.mode == "stream":
            return sum(self._shard_lengths("train"))
        return self.shard.size * min(
            sum(self.rank_files_lengths("train", Shard(rank, self.shard.size)))
            for rank in range(self.shard.size))

    def _shard_lengths(self, split: str) -> list:
        return list(self._builder.info.splits[split].shard_lengths)

    def rank_files_lengths(self, split: str, shard: Shard) -> list:
        """Examples in each file rank `shard.rank` reads: TFDS gives file i to rank i % size."""
        lengths = self._shard_lengths(split)
        if len(lengths) < shard.size:
            raise UserFacingError(
                f"--input=files needs the {split} split in at least {shard.size} files (one "
                f"per worker or more), but {self.data_dir} has {len(lengths)}; prepare it with "
                f"python -m hvd_mnist.prepare --num_shards=8 --data_dir=DIR (make data-sharded)")
        return lengths[shard.rank::shard.size]

    def _records(self, split: str, *, whole: bool):
        read_config = self._tfds.ReadConfig(
            try_autocache=False,  # TFDS would otherwise keep a small split in memory
            num_parallel_calls_for_decode=DECODE_THREADS,
            num_parallel_calls_for_interleave_files=1,
            interleave_cycle_length=1,  # file after file: the records' order is fixed
            input_context=None if whole else tf.distribute.InputContext(
                num_input_pipelines=self.shard.size, input_pipeline_id=self.shard.rank))
        try:
            # Still PNG-encoded: a rank decodes only its own share, after the shard.
            return self._builder.as_dataset(
                split=split, as_supervised=True, shuffle_files=False, read_config=read_config,
                decoders={"image": self._tfds.decode.SkipDecoding()})
        except (tf.errors.OpError, ValueError, AssertionError) as e:
            raise DataError(f"cannot read the {split} split of {splits.DATASET} from "
                            f"{self.data_dir} ({short_reason(e)})") from None

    def train_batches(self, *, seed: int, epoch: int, steps: int, per_rank_batch_size: int,
                      first_step: int = 1):
        """The epoch's batches from step `first_step` on: the same stream, its first
        records skipped before they are decoded."""
        whole = self.mode == "stream"
        seed_words = (seed, epoch) if whole else (seed, epoch, self.shard.rank)
        ds = self._records("train", whole=whole)
        ds = ds.shuffle(self.shuffle_buffer, seed=splits.seed_from_words(seed_words),
                        reshuffle_each_iteration=False)
        if whole:
            global_batch_size = per_rank_batch_size * self.shard.size
            ds = ds.take(steps * global_batch_size).shard(self.shard.size, self.shard.rank)
        else:
            ds = ds.take(steps * per_rank_batch_size)
        ds = ds.skip((first_step - 1) * per_rank_batch_size)
        return self._batched(ds, per_rank_batch_size)

    def eval_batches(self, per_rank_batch_size: int):
        ds = self._records("test", whole=self.mode == "stream")
        if self.mode == "stream":
            ds = ds.shard(self.shard.size, self.shard.rank)
        return self._batched(ds, per_rank_batch_size)

    def _batched(self, ds, batch_size: int):
        dtype = self.dtype

        def decode(png, label):
            image = tf.io.decode_png(png, channels=1)
            image.set_shape(mnist.IMAGE_SHAPE)
            return image, tf.cast(label, tf.int64)

        ds = ds.map(decode, num_parallel_calls=DECODE_THREADS, deterministic=True)
        ds = ds.batch(batch_size).map(lambda images, labels: splits.normalize(images, labels, dtype))
        return splits.without_autotuning(ds.prefetch(PREFETCH_BATCHES))


def open_input(mode: str, data_dir: str, shard: Shard, shuffle_buffer: int, dtype=tf.float32):
    if mode == "memory":
        return MemoryInput(data_dir, shard, dtype)
    if mode in ("stream", "files"):
        return RecordInput(data_dir, shard, mode, shuffle_buffer, dtype)
    raise ValueError(f"unknown input mode {mode!r}")


def bytes_per_epoch(data_dir: str, mode: str, shard: Shard) -> int:
    """Record-file bytes one rank reads per epoch (memory mode reads the split once per run)."""
    import tensorflow_datasets as tfds

    info = tfds.builder(splits.DATASET, data_dir=data_dir).info.splits["train"]
    total = info.num_bytes
    if mode == "memory":
        return 0
    if mode == "stream":
        return total
    lengths = list(info.shard_lengths)
    return round(total * sum(lengths[shard.rank::shard.size]) / sum(lengths))
