"""MNIST in and out of TFDS: preparing it offline, decoding it once, and each rank's batches.

mnist.py names what an image is (28x28, one channel) and the class count, for every layer;
idx.py reads and writes the IDX files; tfds_local.py builds TFDS's mnist from them;
decoded.py keeps a decoded copy beside it, and integrity.py the sha256s every reader
checks; splits.py loads the splits, and order.py (numpy only) orders each epoch's examples
over the ranks; inputs.py turns that into each rank's batches (--input=memory, stream or
files).
"""
