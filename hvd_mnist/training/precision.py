"""Precision (`--precision`): each layer's Keras dtype policy, float16's loss scaling
composed with Horovod, and what the gradients cross the network as.

float64 builds everything in float64 (variables, inputs, optimizer slots, gradients on the
wire): rounding about 1e-16, so N workers must agree with one within 1e-9, the sharpest
check of the distributed arithmetic (verify and tests/test_parity.py run it).

mixed_bfloat16 and mixed_float16 compute every layer but the last in bfloat16 or float16.
The variables stay float32, and so do the last layer (its softmax) and the loss: small
probabilities and their logarithms need float32's range.

On the wire: gradients are taken with respect to the float32 variables (the gradient of
a layer's cast of its variable casts back), so they are float32 in every mixed precision, and
that is what the allreduce sends; `--fp16_allreduce` sends float16 (communication.py).

float16 loss scaling, the same on both paths: the loss times the scale, the gradients,
their average over ranks, then the finiteness check, the unscaling and the update. The
check comes after the allreduce: a NaN or Inf on any one rank makes the average
non-finite, and every rank holds the same average bit for bit, so every rank skips the
same step and halves the same scale. No extra collective is needed for the ranks to agree.
"""

import os

from hvd_mnist import errors
from hvd_mnist.worker import cpu_kernels, keras_compat

COMPUTE_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16",
                  "mixed_float16": "float16", "float64": "float64"}
# Where the kernels of TensorFlow's CPU build (oneDNN) compute bfloat16 in hardware.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_BF16: capped there, oneDNN has
# no bfloat16 instructions whatever the CPU has (emulated, or for the lowest caps none at
# all: ISA_CAPS_WITHOUT_BFLOAT16_CONVOLUTION).
ISA_CAPS_WITHOUT_BFLOAT16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE",
                             "AVX512_CORE_VNNI")
# Caps under which oneDNN has no bfloat16 convolution at all. TensorFlow decides who computes
# bfloat16 by the CPU, not by the cap: with avx512f it hands bfloat16 operations to oneDNN,
# and under these caps the first convolution fails ("could not create a primitive descriptor
# for the convolution forward propagation primitive", seen with AVX2 on the AVX512-BF16
# EPYC). Without avx512f, or with TF_ENABLE_ONEDNN_OPTS=0, TensorFlow's own (Eigen) kernels
# compute bfloat16, as on the AVX2-only machines.
ISA_CAPS_WITHOUT_BFLOAT16_CONVOLUTION = ("SSE41", "AVX", "AVX2", "AVX2_VNNI")
# reports/bfloat16_emulated.md, on the AVX2-only AMD EPYC at -np 1 and 2.
EMULATED_BFLOAT16_SPEED = ("on an AVX2-only CPU it trained at 0.09-0.13x "
                           "--precision=float32's images/s")


def is_mixed(precision: str) -> bool:
    return precision.startswith("mixed_")


def variable_dtype(precision: str) -> str:
    """The dtype of the variables, the inputs, the last layer and the optimizer's slots:
    float64 only with --precision=float64, float32 in every other precision."""
    return "float64" if precision == "float64" else "float32"


def loss_scaling(precision: str) -> bool:
    """float16's 5 exponent bits let small gradients underflow to 0 unless the loss is
    scaled up; bfloat16 has float32's exponent range and needs no scaling."""
    return precision == "mixed_float16"


def layer_dtype(precision: str, dtype):
    """The dtype (policy name) of the layers before the last: the mixed policy, or `dtype`."""
    return precision if is_mixed(precision) else dtype


def with_loss_scaling(precision: str, optimizer):
    """`optimizer`, wrapped in Keras's dynamic LossScaleOptimizer for mixed_float16. Its
    defaults (scale 2**15, doubled after 2000 finite steps, halved at every skipped one)
    are those Keras picks for itself."""
    if not loss_scaling(precision):
        return optimizer
    import tensorflow as tf
    return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)


def wire_dtype(precision: str, *, fp16_allreduce: bool) -> str:
    return "float16" if fp16_allreduce else variable_dtype(precision)


def describe(precision: str, *, fp16_allreduce: bool) -> str:
    """The run's start line about its precision ("" for float32)."""
    if not is_mixed(precision):
        return ""
    scaled = ", the loss scaled dynamically" if loss_scaling(precision) else ""
    return (f"precision {precision}: layers compute in {COMPUTE_DTYPES[precision]}; "
            "variables, the last layer and the loss in float32; gradients cross the network "
            f"as {wire_dtype(precision, fp16_allreduce=fp16_allreduce)}{scaled}")


def cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set:
    """The CPU's feature flags (of its first processor); empty where the file cannot be read."""
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_warning(precision: str, has_gpu: bool, cpuinfo_path: str = "/proc/cpuinfo",
                isa_cap: str | None = None) -> str:
    """One line where the precision will run slower than float32 on this CPU ("" otherwise):
    bfloat16 without bfloat16 instructions, or with oneDNN kept from them by
    ONEDNN_MAX_CPU_ISA (`isa_cap`; None: the environment's), and float16 on any CPU."""
    if has_gpu or not is_mixed(precision):
        return ""
    if precision == "mixed_float16":
        # Not a matter of the CPU's flags: on a Xeon with AVX512-FP16 too, oneDNN ran the
        # float16 convolutions' backward pass in its reference kernels (docs/precision.md).
        return ("warning: no GPU is visible and TensorFlow's CPU kernels have no fast "
                "float16 path: --precision=mixed_float16 runs many times slower than "
                "--precision=float32 here (docs/precision.md)")
    if isa_cap is None:
        isa_cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    flags = cpu_flags(cpuinfo_path)
    if isa_cap.upper() in ISA_CAPS_WITHOUT_BFLOAT16:
        why = f"ONEDNN_MAX_CPU_ISA={isa_cap} keeps oneDNN from bfloat16 instructions"
    elif flags and not flags & set(BFLOAT16_CPU_FLAGS):
        why = ("this CPU has no bfloat16 instructions (neither "
               + " nor ".join(BFLOAT16_CPU_FLAGS) + f" in {cpuinfo_path})")
    else:
        return ""  # native bfloat16, or not Linux's cpuinfo (say, not x86): nothing known
    return (f"warning: {why}: --precision=mixed_bfloat16 is emulated here, converting to and "
            f"from float32 around every operation; {EMULATED_BFLOAT16_SPEED} "
            "(docs/precision.md)")


def check_isa_cap(precision: str, has_gpu: bool, cpuinfo_path: str = "/proc/cpuinfo",
                  environ=os.environ) -> None:
    """Raises UserFacingError where bfloat16 cannot run at all: oneDNN capped below its
    bfloat16 convolution on a CPU where TensorFlow hands bfloat16 to oneDNN."""
    cap = environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    onednn_opts = environ.get(cpu_kernels.VARIABLE, "1").lower() not in ("0", "false")
    if (precision == "mixed_bfloat16" and not has_gpu and onednn_opts
            and cap in ISA_CAPS_WITHOUT_BFLOAT16_CONVOLUTION
            and "avx512f" in cpu_flags(cpuinfo_path)):
        raise errors.UserFacingError(
            f"--precision=mixed_bfloat16 cannot run with ONEDNN_MAX_CPU_ISA={cap} on this CPU: "
            "TensorFlow hands bfloat16 to oneDNN where the CPU has AVX-512, and oneDNN capped "
            f"at {cap} has no bfloat16 convolution; set TF_ENABLE_ONEDNN_OPTS=0 as well to "
            "compute bfloat16 as an AVX2-only CPU does, or unset ONEDNN_MAX_CPU_ISA")


def loss_scale(optimizer) -> float | None:
    """The current loss scale, or None without loss scaling."""
    return keras_compat.loss_scale(optimizer)
