"""make bench's "limit" part: the model's FLOPs counted from its shapes, and the report
that sets each precision's rate beside the machine's peak."""

import tensorflow as tf

from hvd_mnist.data import mnist
from hvd_mnist.training import model as model_lib
from tools.bench import flops, limit, step_breakdown, training_paths


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
        tf.TensorSpec([1, *mnist.IMAGE_SHAPE], tf.float32))
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profiled = tf.compat.v1.profiler.profile(
        graph=convert_variables_to_constants_v2(forward).graph,
        run_meta=tf.compat.v1.RunMetadata(), cmd="op", options=options).total_float_ops
    # The profiler also counts bias adds, activations and pooling, which flops.py leaves out.
    counted = flops.training_flops_per_image(model)["forward"]
    assert counted <= profiled <= 1.01 * counted


def _breakdown(precision, step_ms, conv_ms, peak):
    pieces = [{"name": "Conv2D(64)", "training_flops": 3 * 21_233_664,
               "seconds": conv_ms / 1e3},
              {"name": "optimizer update (Adadelta)", "training_flops": 0, "seconds": 0.25 * step_ms / 1e3}]
    return step_breakdown.summarise({"precision": precision, "batch": 128,
                                     "step": step_ms / 1e3, "pieces": pieces}, peak)


def test_the_breakdown_shares_the_step_among_its_pieces_and_the_rest():
    breakdown = _breakdown("float32", step_ms=40.0, conv_ms=20.0, peak=400.0)
    conv, update = breakdown["pieces"]
    assert conv["share_of_step"] == 0.5 and update["share_of_step"] == 0.25
    assert abs(breakdown["pieces_seconds"] - 0.030) < 1e-12
    assert abs(conv["gflops"] - 128 * 3 * 21_233_664 / 0.020 / 1e9) < 1e-9
    assert conv["fraction_of_peak"] == conv["gflops"] / 400.0
    assert update["gflops"] is None and breakdown["flop_bearing_share"] == 0.5
    assert breakdown["images_per_second"] == 128 / 0.040


def test_a_precision_far_slower_than_float32_is_not_run_under_horovod():
    breakdowns = {"float32": _breakdown("float32", 40.0, 20.0, 400.0),
                  "mixed_bfloat16": _breakdown("mixed_bfloat16", 25.0, 8.0, 1600.0),
                  "mixed_float16": _breakdown("mixed_float16", 4000.0, 3000.0, 300.0)}
    assert limit.too_slow(breakdowns) == {"mixed_float16": "not run under Horovod: its "
                                          "step ran at 0.01x float32's in one process"}


def test_the_float32_runs_of_part_3_are_not_run_again(monkeypatch):
    run = []

    def accuracy_run(name, run_flags, data_dir, out_dir, timeout_seconds):
        run.append(name)
        return {"flags": run_flags, "training_seconds": 30.0, "epoch": 2,
                "final_test_accuracy": 0.991, "curve": [(15.0, 0.98), (30.0, 0.991)]}

    monkeypatch.setattr(training_paths, "accuracy_run", accuracy_run)
    part_3 = {name: {"flags": [], "training_seconds": seconds, "epoch": 3,
                     "final_test_accuracy": 0.992, "curve": [(seconds, 0.992)]}
              for name, seconds in [("seed_custom", 120.0), ("seed_keras", 125.0),
                                    ("fast_custom", 60.0)]}
    out = limit.time_to_accuracy(["float32", "mixed_bfloat16"], "data", "out", part_3)
    assert run == ["limit_accuracy_seed_mixed_bfloat16", "limit_accuracy_fast_mixed_bfloat16"]
    assert out["fast_float32"]["over_seed_float32"] == 0.5
    assert out["seed_mixed_bfloat16"]["over_seed_float32"] == 0.25


def test_each_layer_of_the_real_step_is_timed_with_its_training_flops():
    breakdown = step_breakdown.measure("float32", min_seconds=0.01)
    names = [piece["name"] for piece in breakdown["pieces"]]
    assert names == ["Conv2D(32)", "Conv2D(64)", "MaxPooling2D", "Dropout", "Flatten",
                     "Dense(128)", "Dropout", "Dense(10) and the loss",
                     "optimizer update (Adadelta)"]
    flops_of = {piece["name"]: piece["training_flops"] for piece in breakdown["pieces"]}
    # The first layer needs no gradient of its input (the images): two passes, not three.
    assert flops_of["Conv2D(32)"] == 2 * 2 * 26 * 26 * 32 * 9
    assert flops_of["Conv2D(64)"] == 3 * 2 * 24 * 24 * 64 * 9 * 32
    assert all(piece["seconds"] > 0 for piece in breakdown["pieces"])


def _results():
    runs = {f"{p}_np{n}": {"np": n, "precision": p, "images_per_second": ips,
                           "gflops": ips * 0.0716, "fraction_of_peak": ips * 0.0716 / 200}
            for n, base in ((1, 1000.0), (2, 1800.0))
            for p, ips in (("float32", base), ("mixed_bfloat16", 1.75 * base))}
    seed = {"training_seconds": 300.0, "epoch": 4, "over_seed_float32": 1.0,
            "curve": [(80.0, 0.985), (150.0, 0.988), (225.0, 0.9895), (300.0, 0.9912)]}
    fast = {"training_seconds": 60.0, "epoch": 2, "over_seed_float32": 0.2,
            "curve": [(30.0, 0.9871), (60.0, 0.9904)]}
    return {"flops_per_image": flops.training_flops_per_image(model_lib.build_model()),
            "peak_gflops": {"float32": {"matmul": 200.0, "conv": 150.0}},
            "breakdown": {"float32": _breakdown("float32", 40.0, 20.0, 200.0)},
            "skipped": {"mixed_float16": "not run under Horovod: its step ran at 0.01x "
                                         "float32's in one process"},
            "runs": runs, "example": {"np1": {"images_per_second": 950.0}},
            "bfloat16_over_float32": {"np1": 1.75, "np2": 1.75},
            "time_to_accuracy": {"seed_float32": seed, "fast_mixed_bfloat16": fast}}


def test_the_report_names_the_models_cost_every_run_and_the_peak_fraction():
    text = limit.table(_results())
    assert "24.0 MFLOP forward per image" in text and "71.6 MFLOP per training image" in text
    assert "| float32 | 200 | 150 |" in text
    assert "| mixed_bfloat16_np2 | 3150 | 226 | 113% |" in text
    assert ("| mixed_float16 | – | – | not run under Horovod: its step ran at 0.01x float32's "
            "in one process |") in text
    assert "| Horovod's example, float32, np1 | 950 | 68.0 |  |" in text
    assert "bfloat16 over float32: np1 1.75×, np2 1.75×" in text


def test_the_report_shows_where_the_step_goes():
    text = limit.table(_results())
    assert "| Conv2D(64) | 20.0 | 50% | 408 (204%) |" in text
    assert "| the whole step | 40.0 | 100% | 229 (115%) |" in text
    assert "the FLOPs (convolutions and dense layers, forward and backward): float32 50%" in text


def test_the_report_gives_each_recipes_time_against_the_seed_and_its_curve():
    text = limit.table(_results())
    assert "| seed_float32 | 300 | 1.00× | 4 | 98.50%, 98.80%, 98.95%, 99.12% |" in text
    assert "| fast_mixed_bfloat16 | 60.0 | 0.200× | 2 | 98.71%, 99.04% |" in text


def test_the_curves_of_the_time_to_accuracy_runs_are_drawn(tmp_path):
    out = tmp_path / "reports" / "bench_time_to_accuracy.png"
    limit.plot_time_to_accuracy(_results()["time_to_accuracy"], str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
