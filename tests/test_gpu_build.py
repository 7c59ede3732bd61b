"""The GPU build of Horovod (make setup TF_FLAVOR=gpu), checked where there is no GPU:
NCCL is built in, and the library loads the CUDA runtime and NCCL of the nvidia-*
wheels beside it. Skipped on a venv without those wheels (the CPU flavour).
`make test-gpu-build` runs this file with the parity, fault and step tests."""

import importlib.metadata
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

try:
    importlib.metadata.version("nvidia-nccl-cu12")
    GPU_FLAVOUR = True
except importlib.metadata.PackageNotFoundError:
    GPU_FLAVOUR = False

pytestmark = pytest.mark.skipif(not GPU_FLAVOUR, reason="not the GPU flavour's venv "
                                "(make test-gpu-build)")
BIN = pathlib.Path(sys.executable).parent


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stdout


def test_nccl_is_built_and_horovod_starts_without_a_gpu():
    out = run_python("import horovod.tensorflow as hvd; hvd.init(); "
                     "print(hvd.nccl_built(), hvd.size())")
    nccl_built, size = out.split()
    assert int(nccl_built) > 0 and size == "1"


def test_check_build_lists_nccl_tensorflow_and_gloo():
    report = subprocess.run([str(BIN / "horovodrun"), "--check-build"], capture_output=True,
                            text=True, timeout=300, check=True).stdout
    for line in ("[X] NCCL", "[X] TensorFlow", "[X] Gloo"):
        assert line in report


def mpi_library() -> pathlib.Path:
    horovod_dir = pathlib.Path(importlib.util.find_spec("horovod").origin).parent
    return next((horovod_dir / "tensorflow").glob("mpi_lib*.so"))


def test_the_library_looks_for_cudart_and_nccl_beside_it():
    dynamic = subprocess.run(["readelf", "-d", str(mpi_library())], capture_output=True,
                             text=True, check=True).stdout
    assert "[libnccl.so.2]" in dynamic
    assert "$ORIGIN/../../nvidia/cuda_runtime/lib:$ORIGIN/../../nvidia/nccl/lib" in dynamic


def test_its_cuda_and_nccl_calls_bind_to_tensorflows_own(tmp_path):
    # One CUDA runtime and one NCCL per process, TensorFlow's: every cuda* and nccl* symbol
    # the library needs binds, at load (it is linked with -z now), to TensorFlow's stubs
    # in libtensorflow_framework.so.2, which load the nvidia-* wheels (the next test).
    library = mpi_library()
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(library)],
                               capture_output=True, text=True, check=True).stdout.split()
    needed = {name for name in undefined if name.startswith(("cuda", "__cuda", "nccl"))}
    assert {"cudaSetDevice", "cudaLaunchKernel", "__cudaRegisterFatBinary",
            "ncclAllReduce"} <= needed
    subprocess.run([sys.executable, "-c", "import horovod.tensorflow"], check=True,
                   timeout=300, env={**os.environ, "LD_DEBUG": "bindings",
                                     "LD_DEBUG_OUTPUT": str(tmp_path / "ld")})
    bound = {}
    for log in tmp_path.glob("ld.*"):
        for line in log.read_text().splitlines():
            if f"binding file {library} " in line and "normal symbol `" in line:
                target = line.split(" to ", 1)[1].split(" [", 1)[0]
                bound[line.rsplit("`", 1)[1].rstrip("'")] = pathlib.Path(target).name
    assert {name: bound.get(name) for name in needed} == {
        name: "libtensorflow_framework.so.2" for name in needed}


def test_the_library_loads_nccl_and_cudart_from_the_nvidia_wheels():
    # What a GPU host will load: the wheels' libraries, through the library's RUNPATH,
    # not whatever CUDA the host has installed.
    out = run_python("import horovod.tensorflow as hvd; hvd.init(); "
                     "print(open('/proc/self/maps').read())")
    loaded = {line.split()[-1] for line in out.splitlines() if ".so" in line}
    assert any(path.endswith("/nvidia/nccl/lib/libnccl.so.2") for path in loaded)
    assert any(path.endswith("/nvidia/cuda_runtime/lib/libcudart.so.12") for path in loaded)
