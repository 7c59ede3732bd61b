"""What a run wrote for TensorBoard, read back as the tests check it."""

import os

import tensorflow as tf


def read_scalars(path: str) -> dict:
    """{tag: [(step, value), ...]} from every event file under `path`."""
    from tensorboard.backend.event_processing import event_accumulator

    scalars = {}
    for root, _, names in os.walk(path):
        for name in sorted(names):
            if not name.startswith("events.out.tfevents"):
                continue
            accumulator = event_accumulator.EventAccumulator(
                os.path.join(root, name), size_guidance={event_accumulator.TENSORS: 0})
            accumulator.Reload()
            for tag in accumulator.Tags()["tensors"]:
                scalars.setdefault(tag, []).extend(
                    (event.step, float(tf.make_ndarray(event.tensor_proto)))
                    for event in accumulator.Tensors(tag))
    return {tag: sorted(points) for tag, points in scalars.items()}
