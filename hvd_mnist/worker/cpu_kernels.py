"""TensorFlow's oneDNN kernels on every x86-64 CPU, not only on the newest.

TensorFlow's Linux build turns its oneDNN operations on by itself only where the CPU has
AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (`DefaultOneDnnPolicy`, tensorflow/core/util/
util.cc). Elsewhere, on the AVX2-only EPYC for one, it runs its own Eigen kernels, and there
hvd_mnist's float32 step alone took 1.43x as long as with oneDNN's, the convolutions'
gradients most (reports/lever_onednn_epyc_avx2.md). PyTorch runs oneDNN's convolutions on
those CPUs too.

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it loads, so importing hvd_mnist (its
__init__ imports this module before anything imports TensorFlow) sets it to 1 unless it is
already set. TF_ENABLE_ONEDNN_OPTS=0 keeps TensorFlow's Eigen kernels. bfloat16 is not
moved: TensorFlow hands bfloat16 operations to oneDNN only on CPUs with AVX-512
(training/precision.py). This module must not import TensorFlow.
"""

import os
import platform

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# oneDNN's kernels in TensorFlow's own wheels are for x86-64 only.
X86_64 = ("x86_64", "AMD64")


def prefer_onednn(environ=os.environ, machine: str | None = None) -> None:
    """TF_ENABLE_ONEDNN_OPTS=1 on an x86-64 machine unless the variable is set."""
    if (machine or platform.machine()) in X86_64:
        environ.setdefault(VARIABLE, "1")


prefer_onednn()
