"""What one training image costs the model in floating-point operations, counted from its
layers' shapes (a multiply and an add are two). Forward: a Conv2D is 2 x (output positions
x output channels) x (kernel height x width x input channels); a Dense 2 x inputs x outputs.
Training adds, for every such layer, the gradients of its weights and of its input, each as
many operations as its forward, except the first layer's input gradient. Bias adds,
activations, pooling, dropout and the optimizer's update are left out: under 1% here
(tests/test_bench_tools.py checks the forward count against TensorFlow's own profiler).
"""

import math


def per_layer(model) -> dict:
    """{"Conv2D(64)": forward FLOPs per image, ...} of the layers that cost any, named by kind
    and width: a Keras name depends on how many models the process built before."""
    out = {}
    for layer in model.layers:
        kind = type(layer).__name__
        if kind == "Conv2D":
            kernel_h, kernel_w = layer.kernel_size
            out[f"Conv2D({layer.filters})"] = (2 * math.prod(layer.output.shape[1:3])
                                               * layer.filters * kernel_h * kernel_w
                                               * layer.input.shape[-1])
        elif kind == "Dense":
            out[f"Dense({layer.units})"] = 2 * layer.input.shape[-1] * layer.units
    return out


def training_flops_per_image(model) -> dict:
    layers = per_layer(model)
    forward = sum(layers.values())
    # Forward and both gradients of every layer, but the images' (the first layer's input).
    return {"forward": forward, "training": 3 * forward - next(iter(layers.values())),
            "per_layer_forward": layers}
