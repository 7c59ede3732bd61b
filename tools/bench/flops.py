"""What one training image costs the model in floating-point operations, counted from its
layers' shapes (a multiply and an add are two).

Forward: a Conv2D is 2 x (output positions x output channels) x (kernel height x width x
input channels); a Dense 2 x inputs x outputs. Training adds, for every such layer, the
gradient of its weights (as many operations as its forward) and the gradient of its input
(as many again), except the first layer's: nothing needs the gradient of the images.
Bias adds, activations, pooling, dropout and the optimizer's update are left out: together
under 1% of the total here (tests/test_bench_tools.py checks the forward count against
TensorFlow's own profiler). This model: about 24 MFLOP forward, 72 MFLOP per training
image, nearly all of it the second convolution.
"""

import math


def layer_forward_flops(layer) -> int:
    """Multiply-adds x 2 of one Conv2D or Dense layer for one image; 0 for other layers."""
    kind = type(layer).__name__
    if kind == "Conv2D":
        kernel_h, kernel_w = layer.kernel_size
        input_channels = layer.input.shape[-1]
        output_positions = math.prod(layer.output.shape[1:3])
        return 2 * output_positions * layer.filters * kernel_h * kernel_w * input_channels
    if kind == "Dense":
        return 2 * layer.input.shape[-1] * layer.units
    return 0


def describe(layer) -> str:
    """Conv2D(64), Dense(10), Dropout: the layer's kind and width. Its Keras name would
    depend on how many models the process built before."""
    kind = type(layer).__name__
    width = getattr(layer, "filters", None) or getattr(layer, "units", None)
    return f"{kind}({width})" if width else kind


def per_layer(model) -> list:
    """[(layer, forward FLOPs per image)] of the layers that cost any."""
    return [(describe(layer), flops) for layer in model.layers
            if (flops := layer_forward_flops(layer))]


def training_flops_per_image(model) -> dict:
    layers = per_layer(model)
    forward = sum(flops for _, flops in layers)
    # Forward and both gradients of every layer, but the images' (the first layer's input).
    return {"forward": forward, "training": 3 * forward - layers[0][1],
            "per_layer_forward": dict(layers)}
