"""The hosts to verify: horovodrun's `-H host:slots,...`, or the Slurm allocation this runs in.

Slurm writes node lists compressed (`node[01-03,07],login1`) and tasks per node as
`2(x3),1`; both are expanded here, so verify needs no Slurm commands on the path.
"""

import dataclasses
import itertools
import re

from hvd_mnist.errors import UserFacingError


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


def horovodrun_hosts(hosts) -> str:
    """`hostA:1,hostB:2`, as horovodrun's -H takes it."""
    return ",".join(f"{host.name}:{host.slots}" for host in hosts)


def parse_host_list(text: str) -> list:
    """Hosts of `hostA:1,hostB:2` (a host without `:SLOTS` has one slot)."""
    hosts = []
    for item in text.split(","):
        name, _, slots = item.strip().partition(":")
        if not name or (slots and (not slots.isdigit() or int(slots) < 1)):
            raise UserFacingError(f"--hosts={text}: '{item.strip()}' is not HOST:SLOTS "
                                  "(for example hostA:2, with SLOTS at least 1)")
        hosts.append(Host(name, int(slots or 1)))
    names = [host.name for host in hosts]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserFacingError(f"--hosts={text} names {', '.join(repeated)} more than once; "
                              "give each host once, with all its slots")
    return hosts


def expand_nodelist(nodelist: str) -> list:
    """Slurm's compressed node list as names: `node[01-03,07],gpu-a[1-2]-x` ->
    node01 node02 node03 node07 gpu-a1-x gpu-a2-x. Zero padding follows the range's start;
    several bracket groups in one name give every combination, in Slurm's order."""
    names = []
    for item in _top_level_items(nodelist):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = [_expand_range(part[1:-1], nodelist) if part.startswith("[") else [part]
                   for part in parts if part]
        names += ["".join(combination) for combination in itertools.product(*choices)]
    return names


def _top_level_items(nodelist: str) -> list:
    """The comma-separated names of a node list, leaving commas inside brackets alone."""
    items, depth, current = [], 0, ""
    for char in nodelist.strip():
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise UserFacingError(f"cannot read the Slurm node list '{nodelist}'")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth or not all(items + [current]):
        raise UserFacingError(f"cannot read the Slurm node list '{nodelist}'")
    return items + [current]


def _expand_range(ranges: str, nodelist: str) -> list:
    names = []
    for part in ranges.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not match or (match[2] and int(match[2]) < int(match[1])):
            raise UserFacingError(f"cannot read the Slurm node list '{nodelist}' ('{part}')")
        first, last = match[1], match[2] or match[1]
        names += [str(n).zfill(len(first)) for n in range(int(first), int(last) + 1)]
    return names


def expand_tasks_per_node(text: str) -> list:
    """SLURM_TASKS_PER_NODE's `2(x3),1` -> [2, 2, 2, 1]."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise UserFacingError(f"cannot read SLURM_TASKS_PER_NODE='{text}'")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def from_slurm(environ) -> list:
    """The hosts of the Slurm allocation in `environ`, one slot per task; [] outside one."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return []
    names = expand_nodelist(nodelist)
    if environ.get("SLURM_NTASKS_PER_NODE"):
        slots = [int(environ["SLURM_NTASKS_PER_NODE"])] * len(names)
    elif environ.get("SLURM_TASKS_PER_NODE"):
        slots = expand_tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
    else:
        slots = [1] * len(names)
    if len(slots) != len(names):
        raise UserFacingError(f"the Slurm allocation has {len(names)} nodes ({nodelist}) but "
                              f"tasks for {len(slots)} (SLURM_TASKS_PER_NODE)")
    return [Host(name, count) for name, count in zip(names, slots)]


def resolve(hosts_flag: str, environ) -> list:
    """--hosts when given, else the Slurm allocation; UserFacingError when neither."""
    if hosts_flag:
        return parse_host_list(hosts_flag)
    hosts = from_slurm(environ)
    if not hosts:
        raise UserFacingError("no hosts to verify: pass --hosts=HOST:SLOTS,... or run inside "
                              "a Slurm allocation (SLURM_JOB_NODELIST)")
    return hosts
