"""What every report says about where it was measured: the CPU by model name, family and
vector unit (the same model name runs about 2x faster with AVX-512 than AVX2-only, and a
virtual machine's "AMD EPYC" hides its generation, which the family tells), cores, memory,
kernel, and the time."""

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
    """{"model": ..., "family": ..., "vector_unit": ...} of the first processor;
    "unknown" where /proc/cpuinfo says nothing. The family is x86's "cpu family" and
    "model" numbers (AMD's 25 is Zen 3 and 4, 26 Zen 5), "" where it has none."""
    fields = {}
    try:
        with open(cpuinfo_path) as f:
            for line in f.read().splitlines():
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    family = (f"family {fields['cpu family']} model {fields['model']}"
              if "cpu family" in fields and "model" in fields else "")
    return {"model": fields.get("model name", "unknown CPU"), "family": family,
            "vector_unit": vector_unit(fields.get("flags", "").split())}


def description() -> str:
    """One line: cores (CPU model, vector unit), memory, kernel, Python, and the 1-minute
    load average as the report is written. The bench's own last runs count in it; well
    above their number of ranks, other work shared the machine."""
    processor = cpu()
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    names = [processor["model"], processor["family"], processor["vector_unit"]]
    line = (f"{len(os.sched_getaffinity(0))} cores ({', '.join(n for n in names if n)}), "
            f"{memory_gib:.0f} GiB, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")
    return line + f", load average {os.getloadavg()[0]:.1f}"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
