#!/usr/bin/env bash
# A Slurm cluster on the test bed of tools/hosts.sh: munged and slurmctld on hostA,
# one slurmd per host in that host's namespace (NodeName = its host name, NodeAddr =
# its address), one partition `bed` of all of them. Jobs run as root. Every daemon
# lives in a test host's namespace, so `tools/hosts.sh down` ends them all.
#
#   tools/slurm/bed.sh check        can a Slurm test bed be made here? (else: why not)
#   tools/slurm/bed.sh up N         tools/hosts.sh up N, then the daemons; waits until every node is idle
#   tools/slurm/bed.sh down         stop everything `up` made
#   tools/slurm/bed.sh exec HOST CMD...   CMD on HOST with SLURM_CONF set (sbatch, scontrol, ...)
#   tools/slurm/bed.sh info         SLURM_CONF=... and tools/hosts.sh info
#
# Settings: those of tools/hosts.sh (HOSTS_PREFIX, HOSTS_DIR, HOSTS_SSH_PORT,
# HOSTS_SUBNET). Slurm's files live in $HOSTS_DIR/slurm.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
HOSTS=$HERE/../hosts.sh
PREFIX=${HOSTS_PREFIX:-hvd}
DIR=${HOSTS_DIR:-/run/$PREFIX-hosts}
export HOSTS_DIR=$DIR
SLURM_DIR=$DIR/slurm
CONF=$SLURM_DIR/slurm.conf
MUNGE_SOCKET=$SLURM_DIR/munge/munge.socket

die() { echo "slurm bed: error: $*" >&2; exit 1; }

check() {
  "$HOSTS" check || return 1
  local tool
  for tool in munged slurmctld slurmd sbatch scontrol; do
    command -v "$tool" >/dev/null || {
      echo "$tool is missing (Debian: slurm-wlm and munge; make setup MPI=1 installs them as root)"
      return 1
    }
  done
}

host_address() { "$HOSTS" info | sed -n "s/^$1=//p"; }

write_conf() {
  local hosts=("$@") host nodes="" cpus
  cpus=$(nproc)
  # Every node is this machine: the same cores, listed once per node.
  for host in "${hosts[@]}"; do
    nodes+="NodeName=$host NodeAddr=$(host_address "$host") CPUs=$cpus State=UNKNOWN"$'\n'
  done
  # Ports: Slurm's defaults. Each test bed has its own namespaces, so no two beds'
  # daemons ever share a port space. No cgroups (proctrack/linuxproc, task/none):
  # the namespaces share this machine's cgroup tree, and containers often have none.
  cat >"$CONF" <<EOF
ClusterName=${PREFIX//[^a-z0-9]/}
SlurmctldHost=${hosts[0]}($(host_address "${hosts[0]}"))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it may start again (default 120 s).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$SLURM_DIR/ctld
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdSpoolDir=$SLURM_DIR/%n
SlurmdPidFile=$SLURM_DIR/%n/slurmd.pid
SlurmdLogFile=$SLURM_DIR/%n/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
PropagateResourceLimits=NONE
ReturnToService=2
# A host whose link is cut is marked down after 30-40 s, not the default 5 minutes (the
# job it ran stays COMPLETING until then); and after horovodrun has failed the job
# (ssh's 15 s of keep-alives, then its 5 s to end the workers), not before: a node
# marked down under a running job would requeue it instead (NODE_FAIL, --requeue).
SlurmdTimeout=30
KillWait=30
MinJobAge=600
SchedulerParameters=sched_interval=2,bf_interval=2
$nodes
PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd loads a cgroup plugin even when nothing uses it, and its default one looks
  # for /sys/fs/cgroup, which is not mounted in a namespace's fresh /sys: naming the
  # version skips that look.
  echo "CgroupPlugin=cgroup/v1" >"$SLURM_DIR/cgroup.conf"
  # srun --mpi=pmix keeps files per node and step in a directory each node has to
  # itself (/tmp on a cluster); here the nodes share /tmp, so each slurmd gets its own
  # directory mounted there (start_slurmd).
  echo "PMIxCliTmpDirBase=$SLURM_DIR/pmix" >"$SLURM_DIR/mpi.conf"
}

start_slurmd() {  # in the host's mount namespace (ip netns exec's), with its own PMIx directory
  local host=$1
  mkdir -p "$SLURM_DIR/pmix" "$SLURM_DIR/$host/pmix"
  in_host "$host" sh -c 'mount --bind "$0" "$1" && exec slurmd -f "$2" -N "$3"' \
    "$SLURM_DIR/$host/pmix" "$SLURM_DIR/pmix" "$CONF" "$host"
}

in_host() {  # CMD on HOST with this bed's SLURM_CONF
  local host=$1; shift
  "$HOSTS" exec "$host" env SLURM_CONF="$CONF" "$@"
}

start_munged() {
  mkdir -p "$SLURM_DIR/munge"
  chmod 700 "$SLURM_DIR/munge"
  # The same key for every host: all of them read this one file.
  dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$SLURM_DIR/munge/munge.key"
  in_host "$1" munged --force --socket="$MUNGE_SOCKET" --key-file="$SLURM_DIR/munge/munge.key" \
    --log-file="$SLURM_DIR/munge/munged.log" --pid-file="$SLURM_DIR/munge/munged.pid" \
    --seed-file="$SLURM_DIR/munge/munged.seed"
}

wait_until_idle() {
  local hosts=("$@") deadline=$((SECONDS + 90)) states
  until states=$(in_host "${hosts[0]}" sinfo -h -N -o '%N %t' 2>/dev/null) \
        && [ "$(grep -c ' idle$' <<<"$states")" = "${#hosts[@]}" ]; do
    [ $SECONDS -lt $deadline ] || die "the nodes did not become idle: ${states:-no answer from slurmctld} (logs in $SLURM_DIR)"
    sleep 0.5
  done
}

up() {
  local n=$1 reason host
  reason=$(check) || die "$reason"
  "$HOSTS" up "$n"
  mapfile -t hosts <"$DIR/hosts"
  mkdir -p "$SLURM_DIR/ctld"
  for host in "${hosts[@]}"; do mkdir -p "$SLURM_DIR/$host"; done
  write_conf "${hosts[@]}"
  start_munged "${hosts[0]}"
  in_host "${hosts[0]}" slurmctld -f "$CONF"
  for host in "${hosts[@]}"; do start_slurmd "$host"; done
  wait_until_idle "${hosts[@]}"
  echo "slurm bed: up, nodes ${hosts[*]}, controller ${hosts[0]} (SLURM_CONF=$CONF)"
}

case ${1:-} in
  check) check ;;
  up) up "${2:?up N}" ;;
  down) "$HOSTS" down ;;
  exec)
    host=${2:?exec HOST CMD...}; shift 2
    in_host "$host" "$@" ;;
  info) echo "SLURM_CONF=$CONF"; "$HOSTS" info ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
