"""Checksums of the files make data writes, and the check made before each one is read.

make data records the name, size and sha256 of every file a training process reads (the
TFDS record files and the decoded copy, in the copy's source.json, decoded.py); a process
checks each file it is about to read against that record, so damaged bytes (a flipped
block, a truncated file) stop the run in one line before the first step instead of
training on garbage or failing mid-epoch. sha256 of the decoded copy's 55 MB takes 41 ms
on a quiet 2-core AMD EPYC with SHA-NI (reports/startup_integrity.md); a CRC would buy
nothing (by hand, loaded: sha256 52 ms, zlib.crc32 53 ms), and the record of the TFDS
files was sha256 already.
"""

import hashlib
import os

CHUNK_BYTES = 1 << 22


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(paths: list) -> list:
    """Name, size and sha256 of each file, as source.json records them."""
    return [{"name": os.path.basename(p), "bytes": os.path.getsize(p), "sha256": sha256_of(p)}
            for p in paths]


def first_difference(directory: str, recorded: list):
    """(path, how it differs) for the first file of `recorded` (fingerprint entries of
    files in `directory`) that is missing or is not what was recorded; None if all match.

    The size is compared first: a truncated file is named as such without being read.
    """
    for entry in recorded:
        path = os.path.join(directory, entry["name"])
        try:
            size = os.path.getsize(path)
            if size != entry["bytes"]:
                return path, f"{size} bytes, {entry['bytes']} when it was written"
            if sha256_of(path) != entry["sha256"]:
                return path, "its sha256 is not the one recorded when it was written"
        except OSError as e:
            return path, e.strerror or str(e)
    return None
