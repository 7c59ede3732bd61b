"""Lays out NVIDIA's CUDA 12 wheels of a venv as a CUDA toolkit directory, for building
Horovod's GPU ops against the CUDA and NCCL that TensorFlow's own wheels load.

The wheels hold headers, libraries, ptxas and libdevice but no nvcc, so Horovod's
kernels are compiled by clang (cuda-clang.patch). The directory gives clang and CMake
what they look for in a toolkit: include/ and lib64/ (symlinks into site-packages),
nvvm/, bin/ptxas, a bin/nvcc that only answers CMake's version and location queries,
and bin/fatbinary, which the wheels lack: a wrapper around the image's CUDA 13 one.

    python tools/cuda_toolkit.py SITE_PACKAGES OUT_DIR
"""

import pathlib
import re
import sys

# Wheel directories under site-packages/nvidia whose include/ and lib/ are merged.
# clang's CUDA wrapper header includes curand_mtgp32_kernel.h.
PARTS = ("cuda_runtime", "cuda_nvcc", "cuda_cccl", "curand", "nccl")
CUDA13_FATBINARY = pathlib.Path("/usr/local/cuda-13.0/bin/fatbinary")

# CMake runs `nvcc -v` on a missing file and reads these lines to find the toolkit
# (CMakeDetermineCUDACompiler, cmake_cuda_find_toolkit); `--version` gives the version.
NVCC_STANDIN = """#!/bin/sh
# Not a compiler: answers CMake's toolkit queries for the toolkit laid out here.
here=$(cd "$(dirname "$0")/.." && pwd)
case " $* " in
  *" --version "*)
    echo "nvcc: NVIDIA (R) Cuda compiler driver (stand-in, tools/cuda_toolkit.py)"
    echo "Cuda compilation tools, release {major_minor}, V{version}"
    exit 0 ;;
  *" -v "*)
    echo "#\\$ _HERE_=$here/bin"
    echo "#\\$ _TARGET_DIR_="
    echo "#\\$ TOP=$here"
    echo "#\\$ INCLUDES=\\"-I$here/include\\""
    echo "#\\$ LIBRARIES=\\"-L$here/lib64\\""
    exit 0 ;;
esac
echo "nvcc stand-in: compiles nothing (Horovod's kernels are compiled by clang)" >&2
exit 1
"""

# clang 16 calls `fatbinary --image=profile=sm_NN,file=F` (or compute_NN for PTX);
# CUDA 13's fatbinary takes `--image3=kind=elf|ptx,sm=NN,file=F`. Uncompressed, as
# clang's own fatbinaries are.
FATBINARY_WRAPPER = """#!/bin/sh
# CUDA 13's fatbinary under clang 16's CUDA 12 command line (tools/cuda_toolkit.py).
for arg do
  shift
  case $arg in
    --image=profile=sm_*) arg=$(echo "$arg" | sed 's/^--image=profile=sm_\\([0-9a-z]*\\),/--image3=kind=elf,sm=\\1,/') ;;
    --image=profile=compute_*) arg=$(echo "$arg" | sed 's/^--image=profile=compute_\\([0-9a-z]*\\),/--image3=kind=ptx,sm=\\1,/') ;;
  esac
  set -- "$@" "$arg"
done
exec {fatbinary} --compress=false "$@"
"""


def cuda_version(include_dir: pathlib.Path) -> str:
    """The toolkit version of cuda_runtime_api.h's CUDART_VERSION (12090 -> 12.9)."""
    text = (include_dir / "cuda_runtime_api.h").read_text()
    number = int(re.search(r"#define CUDART_VERSION\s+(\d+)", text).group(1))
    return f"{number // 1000}.{number % 1000 // 10}"


def link_tree(source: pathlib.Path, target: pathlib.Path) -> None:
    """Symlinks source's entries into target, merging directories that several wheels
    share (crt/ comes from both cuda_runtime and cuda_nvcc)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name in ("__init__.py", "__pycache__"):
            continue
        destination = target / entry.name
        if entry.is_dir() and (destination.is_dir() or destination.is_symlink()):
            if destination.is_symlink():
                previous = destination.resolve()
                destination.unlink()
                link_tree(previous, destination)
            link_tree(entry, destination)
        elif not destination.exists():
            destination.symlink_to(entry)


def write_script(path: pathlib.Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def lay_out(site_packages: pathlib.Path, out: pathlib.Path) -> None:
    nvidia = site_packages / "nvidia"
    missing = [part for part in PARTS if not (nvidia / part).is_dir()]
    if missing:
        sys.exit(f"cuda_toolkit: no nvidia/{', nvidia/'.join(missing)} in {site_packages}")
    if not CUDA13_FATBINARY.exists():
        sys.exit(f"cuda_toolkit: {CUDA13_FATBINARY} is missing (the wheels have no fatbinary)")
    for part in PARTS:
        link_tree(nvidia / part / "include", out / "include")
        if (nvidia / part / "lib").is_dir():
            link_tree(nvidia / part / "lib", out / "lib64")
    # The unversioned names the linker looks for.
    for name, soname in (("libcudart.so", "libcudart.so.12"), ("libnccl.so", "libnccl.so.2")):
        if not (out / "lib64" / name).exists():
            (out / "lib64" / name).symlink_to(soname)
    if not (out / "nvvm").exists():
        (out / "nvvm").symlink_to(nvidia / "cuda_nvcc" / "nvvm")
    (out / "bin").mkdir(exist_ok=True)
    if not (out / "bin" / "ptxas").exists():
        (out / "bin" / "ptxas").symlink_to(nvidia / "cuda_nvcc" / "bin" / "ptxas")
    version = cuda_version(out / "include")
    write_script(out / "bin" / "nvcc",
                 NVCC_STANDIN.format(major_minor=version, version=f"{version}.0"))
    write_script(out / "bin" / "fatbinary", FATBINARY_WRAPPER.format(fatbinary=CUDA13_FATBINARY))
    (out / "version.txt").write_text(f"CUDA Version {version}.0\n")
    print(f"{out}: CUDA {version} toolkit from {nvidia}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lay_out(pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve())
