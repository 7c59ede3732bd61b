"""Part "limit" of make bench: each precision's custom loop against what this machine's cores
can do at all. Achieved GFLOP/s (images/s x the model's training FLOPs per image, flops.py)
over the peak of the dtype its layers compute in: in this process on every core, the higher
of a 2048 x 2048 matmul and the model's own second convolution (oneDNN's convolutions can
beat its matmul). A precision whose step alone runs at under SKIP_BELOW of float32's
(float16 on CPUs, bfloat16 on CPUs without its instructions) is not run under Horovod in any
part of the bench (screen_precisions, which the bench calls first), with the reason in the
report. Then one float32 step taken apart, TensorFlow beside PyTorch (step_profile.py;
torch_python is the PyTorch venv's interpreter, which the bench makes first)."""

from tools.bench import flops, step_profile, tables, training_paths

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# The dtype a precision's convolutions and matmuls run in (its variables stay float32).
COMPUTE_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16",
                 "mixed_float16": "float16"}
MATMUL_SIZE = 2048
CONV_BATCH = 128
SKIP_BELOW = 0.25


def gflops_of(op, flops_per_call: float, min_seconds: float = 2.0) -> float:
    """GFLOP/s of op() after two warm-up calls (tracing), over at least min_seconds."""
    return flops_per_call / step_profile.seconds_per_call(op, min_seconds,
                                                          step_profile.tf_fetch) / 1e9


def peaks() -> dict:
    """{dtype: {"matmul": GFLOP/s, "conv": GFLOP/s}} in this process, every core."""
    import tensorflow as tf
    out = {}
    for dtype in COMPUTE_DTYPE.values():
        a = tf.cast(tf.random.uniform([MATMUL_SIZE, MATMUL_SIZE]), dtype)
        images = tf.cast(tf.random.uniform([CONV_BATCH, 26, 26, 32]), dtype)
        kernel = tf.cast(tf.random.uniform([3, 3, 32, 64]), dtype)
        out[dtype] = {
            "matmul": gflops_of(tf.function(lambda: tf.matmul(a, a)), 2 * MATMUL_SIZE ** 3),
            "conv": gflops_of(tf.function(lambda: tf.nn.conv2d(images, kernel, 1, "VALID")),
                              2 * CONV_BATCH * 24 * 24 * 64 * 3 * 3 * 32)}
        print(f"limit: {dtype} peak: matmul {out[dtype]['matmul']:.0f} GFLOP/s, the model's "
              f"convolution {out[dtype]['conv']:.0f} GFLOP/s", flush=True)
    return out


def too_slow(step_rates: dict) -> dict:
    """{precision: why it is not run under Horovod} for each precision whose step alone ran
    at under SKIP_BELOW of float32's."""
    ratios = {p: rate / step_rates["float32"] for p, rate in step_rates.items()}
    return {p: f"not run under Horovod: its step alone ran at {ratio:.2f}x float32's"
            for p, ratio in ratios.items() if ratio < SKIP_BELOW}


def screen_precisions() -> dict:
    """Each precision's step alone in this process, and the precisions too slow to run
    under Horovod here: {"step_alone_images_per_second": ..., "skipped": too_slow's}."""
    # float32's in full, the figure part paths reports; a few steps of each other precision
    # (float16's can take seconds apiece).
    rates = {precision: (training_paths.step_alone_images_per_second() if precision == "float32"
                         else training_paths.step_alone_images_per_second(precision, 2, 2))
             for precision in PRECISIONS}
    return {"step_alone_images_per_second": rates, "skipped": too_slow(rates)}


def measure(results: dict, nps: list, data_dir: str, out_dir: str, torch_python: str) -> dict:
    """results["precisions"] is screen_precisions()'s."""
    from hvd_mnist.training import model as model_lib
    cost = flops.training_flops_per_image(model_lib.build_model())
    out = {"flops_per_image": cost, "peak_gflops": peaks(), "runs": {},
           **results["precisions"]}
    earlier = results.get("throughput", {})  # float32's runs, where part paths made them
    for precision in (p for p in PRECISIONS if p not in out["skipped"]):
        peak = max(out["peak_gflops"][COMPUTE_DTYPE[precision]].values())
        for np_ in nps:
            name = f"{precision}_np{np_}"
            run = (earlier.get(f"custom_np{np_}") if precision == "float32" else None) or (
                training_paths.throughput_run(f"limit_{name}", np_, [f"--precision={precision}"],
                                              data_dir, out_dir))
            gflops = run["images_per_second"] * cost["training"] / 1e9
            out["runs"][name] = {"np": np_, "precision": precision,
                                 "images_per_second": run["images_per_second"],
                                 "gflops": gflops, "fraction_of_peak": gflops / peak}
    out["step_profile"] = step_profile.measure(torch_python, min_seconds=1.0)
    return out


def table(results: dict) -> str:
    f, cost = tables.figure, results["flops_per_image"]
    layers = ", ".join(f"{name} {value / 1e6:.2f}" for name, value in
                       cost["per_layer_forward"].items())
    rows = [[name, f(run["images_per_second"]), f(run["gflops"]),
             f"{100 * run['fraction_of_peak']:.0f}%"] for name, run in results["runs"].items()]
    rows += [[precision, tables.MISSING, tables.MISSING, reason]
             for precision, reason in results["skipped"].items()]
    return "\n".join([
        f"The model: {cost['forward'] / 1e6:.1f} MFLOP forward per image ({layers}), "
        f"{cost['training'] / 1e6:.1f} MFLOP per training image (tools/bench/flops.py).", "",
        tables.markdown(["peak, every core, this process", "matmul GFLOP/s",
                         "the model's convolution GFLOP/s"],
                        [[dtype, f(p["matmul"]), f(p["conv"])]
                         for dtype, p in results["peak_gflops"].items()]), "",
        tables.markdown(["custom loop", "images/s", "GFLOP/s", "of its dtype's peak"], rows), "",
        "One float32 training step taken apart in one thread (the peaks above are of every "
        "core), the same model, batch and Adam in each framework (tools/bench/step_profile.py):",
        "", step_profile.markdown(results["step_profile"])])
