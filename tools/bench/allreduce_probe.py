"""The gradients' allreduce at -np 2, for make step-profile: under horovodrun, Horovod's
grouped allreduce of tensors of the model's gradients' shapes; under torchrun (--torch),
PyTorch's all_reduce of the same bytes over Gloo, as one flat buffer (DDP's one 25 MB bucket
holds them all) and tensor by tensor. Each call starts after a barrier, so no rank's wait
for the other is counted; medians of REPEATS after WARMUP. Rank 0 prints `PROBE {json}`.

    horovodrun -np 2 -H localhost:2 python -m tools.bench.allreduce_probe
    torchrun --standalone --nproc_per_node=2 -m tools.bench.allreduce_probe --torch
"""

import json
import statistics
import sys
import time

WARMUP, REPEATS = 3, 15


def median_seconds(function, barrier) -> float:
    seconds = []
    for repeat in range(WARMUP + REPEATS):
        barrier()
        start = time.perf_counter()
        function()
        if repeat >= WARMUP:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def horovod() -> tuple:
    """(rank, figures) of Horovod's allreduce, one TF thread, as the step profile has."""
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


def gloo() -> tuple:
    """(rank, figures) of PyTorch's all_reduce and average, one thread."""
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


if __name__ == "__main__":
    rank, figures = gloo() if sys.argv[1:] == ["--torch"] else horovod()
    if rank == 0:
        print("PROBE " + json.dumps(figures), flush=True)
