"""What every report says about where it was measured: the CPU by model name and vector
unit (the same model name runs about 2x faster with AVX-512 than AVX2-only), cores,
memory, kernel, and the time."""

import datetime
import os
import platform


def vector_unit(cpu_flags) -> str:
    """The widest vector unit in /proc/cpuinfo's flags, with bfloat16 instructions (AVX-512
    BF16) and AMX where the CPU has them: both decide what mixed precision can gain."""
    flags = set(cpu_flags)
    unit = ("AVX-512" if "avx512f" in flags else "AVX2-only" if "avx2" in flags
            else "no AVX2")
    return (unit + (" + BF16" if "avx512_bf16" in flags else "")
            + (" + AMX" if "amx_tile" in flags else ""))


def cpu(cpuinfo_path: str = "/proc/cpuinfo") -> dict:
    """{"model": ..., "vector_unit": ...}, "unknown" where /proc/cpuinfo says nothing."""
    model, flags = "unknown CPU", []
    try:
        with open(cpuinfo_path) as f:
            lines = f.read().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines
                     if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return {"model": model, "vector_unit": vector_unit(flags)}


def description() -> str:
    """One line: cores (CPU model, vector unit), memory, kernel, Python, and the 1-minute
    load average as the report is written. The bench's own last runs count in it; well
    above their number of ranks, other work shared the machine."""
    processor = cpu()
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    line = (f"{len(os.sched_getaffinity(0))} cores ({processor['model']}, "
            f"{processor['vector_unit']}), {memory_gib:.0f} GiB, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")
    return line + f", load average {os.getloadavg()[0]:.1f}"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
