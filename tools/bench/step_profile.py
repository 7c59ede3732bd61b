"""make step-profile: where one training step's time goes, TensorFlow beside PyTorch.

One process, one thread, a synthetic batch of 128, the model and Adam of versus.py's job;
then the gradients' allreduce at -np 2 under Horovod and over Gloo.

    python -m tools.bench.step_profile [--min_seconds=1] [--out=runs/bench/step_profile.json]

Each half runs in a process of its own, `--only=tensorflow` here (hvd_mnist's model and step
as a one-rank Horovod job) and `--only=torch` in the PyTorch venv, and times every layer's
forward (in training mode: dropout draws its mask), its forward and backward (driven by a
fixed upstream gradient; the backward is the difference), Adam's update and the whole step;
then its framework's profiler gives each op's time. The allreduces run under horovodrun and
torchrun.
"""

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile
import time

from tools.bench import launch, machine, tables, versus

TIMEOUT_SECONDS = 900
WARMUP, REPEATS = 3, 15  # of each allreduce
TOP_OPS = 12
BATCH = 128
PROFILED_STEPS = 10
PIECES = ("Conv2D(32)", "Conv2D(64)", "MaxPooling2D", "Dropout(0.25)", "Flatten", "Dense(128)",
          "Dropout(0.5)", "Dense(10) and the loss")


def seconds_per_call(function, min_seconds: float, fetch=lambda result: None) -> float:
    """Wall seconds of one call, after two warm-up calls (tracing); fetch(result) waits for
    a call's outputs (TensorFlow's eager calls may return before the work ends)."""
    for _ in range(2):
        fetch(function())
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < min_seconds:
        result = function()
        calls += 1
    fetch(result)
    return (time.perf_counter() - start) / calls


def tf_fetch(result) -> None:
    import tensorflow as tf
    for tensor in tf.nest.flatten(result):
        tensor.numpy()


def layer_pass(layer, layer_input, output, labels, loss_fn, needs_input_gradient: bool):
    """A tf.function: the layer's forward and its share of the backward pass, driven by a
    fixed random upstream gradient (the last layer: by the loss)."""
    import tensorflow as tf
    upstream = tf.random.normal(output.shape, dtype=tf.float32)

    @tf.function
    def both():
        with tf.GradientTape() as tape:
            tape.watch(layer_input)
            result = layer(layer_input, training=True)
            objective = (loss_fn(labels, result) if labels is not None
                         else tf.reduce_sum(tf.cast(result, tf.float32) * upstream))
        targets = ([layer_input] if needs_input_gradient else []) + layer.trainable_variables
        return tape.gradient(objective, targets) if targets else [objective]
    return both


def op_profile(step, steps: int) -> list:
    """[{op, ms_per_step}] of `steps` calls of `step`, from TensorFlow's profiler: the
    events of TF's compute threads, named scope/op:kernel, summed per name."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            float(step())
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        with open(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0],
                  "rb") as f:
            space.ParseFromString(f.read())
    totals = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name.replace("::", ""):  # scope/op:kernel, not the executor's own
                    totals[name] += event.duration_ps / 1e9 / steps
    return [{"op": op, "ms_per_step": ms} for op, ms in totals.most_common()]


def tensorflow_step(optimizer_name: str, learning_rate: float, precision: str = "float32"):
    """hvd_mnist's model and training step (training/step.py) in this process as a one-rank
    Horovod job, on one synthetic batch of BATCH: (model, optimizer, loss, (images, labels),
    the step as a function of no arguments)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from hvd_mnist.data import mnist
    from hvd_mnist.training import model as model_lib, step as step_lib
    hvd.init()
    tf.keras.utils.set_random_seed(0)
    model = model_lib.build_model(precision=precision)
    optimizer = model_lib.make_optimizer(optimizer_name, learning_rate)
    loss_fn = model_lib.make_loss()
    images = tf.random.uniform([BATCH, *mnist.IMAGE_SHAPE])
    labels = tf.random.uniform([BATCH], maxval=mnist.NUM_CLASSES, dtype=tf.int64)
    train_step = step_lib.make_train_step(model, optimizer, loss_fn)
    return model, optimizer, loss_fn, (images, labels), lambda: train_step(images, labels)


def timed(pieces: list, update, step, op_profile, min_seconds: float,
          fetch=lambda result: None) -> dict:
    """The figures of one half: each (name, forward, forward and backward) piece's forward
    and backward ms, the optimizer's update, the whole step, and the profiler's ops."""
    out = []
    for name, forward, both in pieces:
        forward_seconds = seconds_per_call(forward, min_seconds, fetch)
        out.append({"name": name, "forward_ms": 1e3 * forward_seconds,
                    "backward_ms": 1e3 * (seconds_per_call(both, min_seconds, fetch)
                                          - forward_seconds)})
    return {"batch": BATCH, "pieces": out,
            "optimizer_ms": 1e3 * seconds_per_call(update, min_seconds, fetch),
            "step_ms": 1e3 * seconds_per_call(step, min_seconds, fetch),
            "profiled_steps": PROFILED_STEPS, "ops": op_profile(step, PROFILED_STEPS)}


def measure_tensorflow(min_seconds: float) -> dict:
    import tensorflow as tf
    model, optimizer, loss_fn, (images, labels), step = tensorflow_step("adam", 0.001)
    optimizer.build(model.trainable_variables)
    pieces, layer_input = [], images
    for index, (name, layer) in enumerate(zip(PIECES, model.layers)):
        output = layer(layer_input, training=True)
        is_last = index == len(model.layers) - 1
        forward = tf.function(lambda layer=layer, x=layer_input: layer(x, training=True))
        pieces.append((name, forward, layer_pass(layer, layer_input, output,
                                                 labels if is_last else None, loss_fn,
                                                 needs_input_gradient=index > 0)))
        layer_input = output
    gradients = [tf.random.normal(v.shape) * 1e-3 for v in model.trainable_variables]
    update = tf.function(lambda: optimizer.apply_gradients(
        zip(gradients, model.trainable_variables)))
    return {"framework": f"TensorFlow {tf.__version__}", "threads": 1,
            **timed(pieces, update, step, op_profile, min_seconds, tf_fetch)}


def measure_torch(min_seconds: float) -> dict:
    import torch
    import torch.nn.functional as F
    from tools.bench.torch_ddp import mnist_cnn
    torch.manual_seed(0)
    model = mnist_cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, eps=1e-7)
    images = torch.rand(BATCH, 1, 28, 28)
    labels = torch.randint(0, 10, (BATCH,))

    def step():
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    pieces, layer_input = [], images
    for index, (name, piece) in enumerate(zip(PIECES, model)):
        output = piece(layer_input).detach()
        is_last = index == len(model) - 1
        upstream = torch.randn_like(output)
        x = layer_input.detach().requires_grad_(index > 0)

        def both(piece=piece, x=x, upstream=upstream, is_last=is_last):
            model.zero_grad(set_to_none=True)  # new gradients each call, as TF's tape gives
            x.grad = None
            result = piece(x)
            if is_last:
                F.cross_entropy(result, labels).backward()
            elif result.requires_grad:
                result.backward(upstream)

        pieces.append((name, lambda piece=piece, x=x: piece(x), both))
        layer_input = output
    gradients = [torch.randn_like(parameter) * 1e-3 for parameter in model.parameters()]

    def update():
        # Timing the pieces leaves most gradients None, and Adam skips a parameter without one.
        for parameter, gradient in zip(model.parameters(), gradients):
            parameter.grad = gradient
        optimizer.step()

    return {"framework": f"PyTorch {torch.__version__}", "threads": torch.get_num_threads(),
            **timed(pieces, update, step, torch_op_profile, min_seconds)}


def torch_op_profile(step, steps: int) -> list:
    """[{op, ms_per_step}]: each op's own CPU time over `steps` steps, from torch.profiler."""
    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            step()
    totals = collections.Counter({event.key: event.self_cpu_time_total / 1e3 / steps
                                  for event in profiler.key_averages()})
    return [{"op": op, "ms_per_step": ms} for op, ms in totals.most_common() if ms > 0]


def median_seconds(function, barrier) -> float:
    """Median seconds of REPEATS calls after WARMUP, each after a barrier, so that no rank's
    wait for the other is counted."""
    seconds = []
    for repeat in range(WARMUP + REPEATS):
        barrier()
        start = time.perf_counter()
        function()
        if repeat >= WARMUP:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def horovod_allreduce() -> tuple:
    """(rank, figures) of Horovod's grouped allreduce of tensors of the model's gradients'
    shapes, one TF thread as the halves have."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from hvd_mnist.training import model as model_lib
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    gradients = [tf.random.normal(v.shape) for v in model_lib.build_model().trainable_variables]
    # The gradients go in as arguments: Horovod names its ops after symbolic tensors.
    allreduce = tf.function(lambda *tensors: hvd.grouped_allreduce(list(tensors), op=hvd.Average))
    seconds = median_seconds(lambda: [t.numpy() for t in allreduce(*gradients)],
                             lambda: hvd.allreduce(tf.constant(0.0), name="barrier").numpy())
    return hvd.rank(), {"gradient_bytes": sum(g.numpy().nbytes for g in gradients),
                        "allreduce_fp32_seconds": seconds}


def gloo_allreduce() -> tuple:
    """(rank, figures) of PyTorch's all_reduce and average of the same bytes over Gloo, one
    thread: as one flat buffer (DDP's one 25 MB bucket holds them all) and tensor by tensor."""
    import torch
    import torch.distributed as dist
    from tools.bench.torch_ddp import mnist_cnn
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    size = dist.get_world_size()
    gradients = [torch.randn_like(p) for p in mnist_cnn().parameters()]
    flat = torch.cat([g.reshape(-1) for g in gradients])

    def per_tensor():
        for gradient in gradients:
            dist.all_reduce(gradient)
            gradient.div_(size)

    result = {"ranks": size, "gradient_bytes": flat.numel() * flat.element_size(),
              "allreduce_flat_seconds": median_seconds(
                  lambda: dist.all_reduce(flat) or flat.div_(size), dist.barrier),
              "allreduce_per_tensor_seconds": median_seconds(per_tensor, dist.barrier)}
    rank = dist.get_rank()
    dist.destroy_process_group()
    return rank, result



ALLREDUCES = {"horovod_allreduce": horovod_allreduce, "gloo_allreduce": gloo_allreduce}


def run(command: list, prefix: str) -> dict:
    result = launch.run(command, TIMEOUT_SECONDS, cwd=launch.REPO_ROOT)
    if result.returncode != 0:
        raise SystemExit(f"step_profile: failed ({result.returncode}): {' '.join(command)}\n"
                         + (result.stdout + result.stderr)[-3000:])
    return launch.last_json_line(result.stdout, prefix)


def measure(torch_python: str, min_seconds: float) -> dict:
    seconds = f"--min_seconds={min_seconds}"
    return {
        "tensorflow": run(launch.python_module("tools.bench.step_profile", "--only=tensorflow",
                                               seconds), "PROFILE "),
        "torch": run(launch.python_module("tools.bench.step_profile", "--only=torch", seconds,
                                          python=torch_python), "PROFILE "),
        "horovod_allreduce": run(launch.horovodrun_command(2, launch.python_module(
            "tools.bench.step_profile", "--only=horovod_allreduce")), "[0]<stdout>:PROBE "),
        "torch_allreduce": run(versus.torchrun_command(
            2, torch_python, "--only=gloo_allreduce", module="tools.bench.step_profile"),
            "PROBE "),
    }


def pieces_table(profile: dict) -> str:
    tf_, pt = profile["tensorflow"], profile["torch"]
    f = tables.figure

    def backward(ms) -> str:
        """A backward is a difference of two timings: below zero it is their noise, shown
        as ≈0 and counted as 0."""
        return "" if ms is None else "≈0" if ms < 0 else f(ms)

    def row(name, tf_ms, pt_ms, tf_backward=None, pt_backward=None) -> list:
        """TF's and PyTorch's ms (a piece's forward, then its backward), and TF / PyTorch."""
        ratio = (tf_ms + max(tf_backward or 0, 0)) / (pt_ms + max(pt_backward or 0, 0))
        return [name, f(tf_ms), backward(tf_backward), f(pt_ms), backward(pt_backward),
                tables.ratio(ratio)]

    rows = [row(a["name"], a["forward_ms"], b["forward_ms"], a["backward_ms"], b["backward_ms"])
            for a, b in zip(tf_["pieces"], pt["pieces"])]
    added = [sum(p["forward_ms"] + max(p["backward_ms"], 0) for p in side["pieces"])
             + side["optimizer_ms"] for side in (tf_, pt)]
    hvd, gloo = profile["horovod_allreduce"], profile["torch_allreduce"]
    rows += [row("optimizer update (Adam)", tf_["optimizer_ms"], pt["optimizer_ms"]),
             row("the pieces, each timed alone, added up", *added),
             row("**the whole step**", tf_["step_ms"], pt["step_ms"]),
             row(f"allreduce of the gradients at -np 2 ({hvd['gradient_bytes'] / 1e6:.1f} MB; "
                 "PyTorch: one flat buffer)", 1e3 * hvd["allreduce_fp32_seconds"],
                 1e3 * gloo["allreduce_flat_seconds"]),
             ["the same, PyTorch tensor by tensor", "", "",
              f(1e3 * gloo["allreduce_per_tensor_seconds"]), "", ""]]
    return tables.markdown([f"one thread, batch {tf_['batch']}", f"{tf_['framework']}: forward ms",
                            "backward ms", f"{pt['framework']}: forward ms", "backward ms",
                            "TF / PyTorch"], rows)


def ops_table(side: dict) -> str:
    rows = [[op["op"], tables.figure(op["ms_per_step"]),
             f"{100 * op['ms_per_step'] / side['step_ms']:.0f}%"]
            for op in side["ops"][:TOP_OPS]]
    return tables.markdown([f"{side['framework']}'s profiler: op", "ms per step",
                            "of the step timed alone"], rows)


def markdown(profile: dict) -> str:
    return "\n\n".join([pieces_table(profile), ops_table(profile["tensorflow"]),
                        ops_table(profile["torch"])])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min_seconds", type=float, default=1.0,
                        help="Each piece is called for at least this long.")
    parser.add_argument("--out", default="runs/bench/step_profile.json")
    parser.add_argument("--only", choices=("tensorflow", "torch", *ALLREDUCES),
                        help="One part alone, as one JSON line: a half in this process (torch: "
                        "the PyTorch venv's), an allreduce under horovodrun or torchrun.")
    args = parser.parse_args(argv)
    if args.only in ALLREDUCES:
        rank, figures = ALLREDUCES[args.only]()
        if rank == 0:
            print("PROBE " + json.dumps(figures), flush=True)
        return
    if args.only:
        started = time.perf_counter()
        if args.only == "tensorflow":
            import tensorflow as tf
            tf.config.threading.set_intra_op_parallelism_threads(1)  # before the first op
            tf.config.threading.set_inter_op_parallelism_threads(1)
            result = measure_tensorflow(args.min_seconds)
        else:
            import torch
            torch.set_num_threads(1)
            result = measure_torch(args.min_seconds)
        print("PROFILE " + json.dumps({**result, "seconds": time.perf_counter() - started}),
              flush=True)
        return
    profile = {"machine": machine.description(), "date": machine.now(),
               **measure(launch.torch_python(), args.min_seconds)}
    profile["load_average_after"] = os.getloadavg()[0]
    markdown_path = tables.write(args.out, profile, (
        f"{profile['machine']}, {profile['date']}; load average at the end "
        f"{profile['load_average_after']:.1f}\n\n{markdown(profile)}"))
    print(f"step_profile: wrote {args.out} and {markdown_path}")


if __name__ == "__main__":
    main(sys.argv[1:])
