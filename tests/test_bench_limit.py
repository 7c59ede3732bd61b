"""make bench's "limit" part: the model's FLOPs counted from its shapes, and the report
that sets each precision's rate beside the machine's peak."""

import tensorflow as tf

from hvd_mnist.training import model as model_lib
from tools.bench import flops, limit


def test_training_costs_forward_plus_both_gradients_except_the_images_gradient():
    cost = flops.training_flops_per_image(model_lib.build_model())
    layers = cost["per_layer_forward"]
    conv1, conv2, dense1, dense2 = layers.values()
    assert conv1 == 2 * 26 * 26 * 32 * 3 * 3 * 1
    assert conv2 == 2 * 24 * 24 * 64 * 3 * 3 * 32
    assert (dense1, dense2) == (2 * 12 * 12 * 64 * 128, 2 * 128 * 10)
    assert cost["forward"] == conv1 + conv2 + dense1 + dense2
    assert cost["training"] == 3 * cost["forward"] - conv1


def test_the_forward_count_agrees_with_tensorflows_profiler_within_one_percent():
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)
    model = model_lib.build_model()
    forward = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([1, *model_lib.INPUT_SHAPE], tf.float32))
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profiled = tf.compat.v1.profiler.profile(
        graph=convert_variables_to_constants_v2(forward).graph,
        run_meta=tf.compat.v1.RunMetadata(), cmd="op", options=options).total_float_ops
    # The profiler also counts bias adds, activations and pooling, which flops.py leaves out.
    counted = flops.training_flops_per_image(model)["forward"]
    assert counted <= profiled <= 1.01 * counted


def _results():
    runs = {f"{p}_np{n}": {"np": n, "precision": p, "images_per_second": ips,
                           "gflops": ips * 0.0716, "fraction_of_peak": ips * 0.0716 / 200}
            for n, base in ((1, 1000.0), (2, 1800.0))
            for p, ips in (("float32", base), ("mixed_bfloat16", 1.75 * base),
                           ("mixed_float16", 0.5 * base))}
    return {"flops_per_image": flops.training_flops_per_image(model_lib.build_model()),
            "peak_gflops": {"float32": {"matmul": 200.0, "conv": 150.0}},
            "runs": runs, "example": {"np1": {"images_per_second": 950.0}},
            "bfloat16_over_float32": {"np1": 1.75, "np2": 1.75},
            "time_to_accuracy": {"float32": {"training_seconds": 300.0, "epoch": 4,
                                             "final_test_accuracy": 0.9912}}}


def test_the_report_names_the_models_cost_every_run_and_the_peak_fraction():
    text = limit.table(_results())
    assert "24.0 MFLOP forward per image" in text and "71.6 MFLOP per training image" in text
    assert "| float32 | 200 | 150 |" in text
    assert "| mixed_bfloat16_np2 | 3150 | 226 | 113% |" in text
    assert "| Horovod's example, float32, np1 | 950 | 68.0 |  |" in text
    assert "bfloat16 over float32: np1 1.75×, np2 1.75×" in text
    assert "| float32 | 300 | 4 | 99.12% |" in text
