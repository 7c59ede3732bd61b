#!/usr/bin/env bash
# A test bed of hosts on this one machine: each host is a Linux network
# namespace with its own address, /etc/hosts, hostname and an sshd, joined to
# the others through a bridge that lives in a namespace of its own, so the
# root namespace has no address on the test network and nothing can reach any
# address outside these namespaces. horovodrun is started inside the first
# host (as on a cluster, from a node) and reaches the others over ssh.
#
#   tools/hosts.sh check             can a test bed be made here? (else: why not)
#   tools/hosts.sh up N [--pin]      N hosts: hostA, hostB, ...; --pin: host i on CPU i mod cores
#   tools/hosts.sh down              remove everything `up` made
#   tools/hosts.sh shape RATE DELAY  every link: tc tbf RATE (e.g. 1gbit, 100mbit) + netem DELAY
#   tools/hosts.sh shape off         remove the shaping
#   tools/hosts.sh link HOST down|up cut or restore one host's link
#   tools/hosts.sh sshd HOST stop|start
#   tools/hosts.sh exec HOST CMD...  run CMD on HOST (its namespace, /etc/hosts and hostname)
#   tools/hosts.sh info              ssh port, key and host addresses, as shell assignments
#
# Settings (environment): HOSTS_PREFIX (default hvd; namespaces are
# <prefix>-hostA ...), HOSTS_DIR (default /run/<prefix>-hosts: keys, sshd
# configs, logs), HOSTS_SSH_PORT (default 2222), HOSTS_SUBNET (default 10.77.0;
# it exists only inside these namespaces, so several test beds can share it).
set -euo pipefail

PREFIX=${HOSTS_PREFIX:-hvd}
DIR=${HOSTS_DIR:-/run/$PREFIX-hosts}
SSH_PORT=${HOSTS_SSH_PORT:-2222}
SUBNET=${HOSTS_SUBNET:-10.77.0}
BRIDGE_NS=$PREFIX-net
LETTERS=(A B C D E F G H)

die() { echo "hosts: error: $*" >&2; exit 1; }

host_name() { echo "host${LETTERS[$1]}"; }
host_ns() { echo "$PREFIX-$1"; }
host_address() {  # hostA -> SUBNET.11, hostB -> SUBNET.12, ...
  local letter=${1#host} i
  for i in "${!LETTERS[@]}"; do
    [ "${LETTERS[$i]}" = "$letter" ] && { echo "$SUBNET.$((11 + i))"; return; }
  done
  die "unknown host '$1'"
}
hosts_up() { cat "$DIR/hosts" 2>/dev/null || true; }

check() {
  [ "$(id -u)" = 0 ] || { echo "needs root to make network namespaces (running as uid $(id -u))"; return 1; }
  local tool
  for tool in ip tc unshare ssh ssh-keygen /usr/sbin/sshd; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (Debian: iproute2, util-linux, openssh-client, openssh-server)"; return 1; }
  done
  local probe=$PREFIX-probe$$
  ip netns add "$probe" 2>/dev/null || { echo "cannot create a network namespace (ip netns add failed)"; return 1; }
  ip netns del "$probe"
}

in_host() {  # in_host HOST CMD...: CMD in HOST's namespace, with HOST's name as hostname
  local host=$1; shift
  ip netns exec "$(host_ns "$host")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

write_ssh_files() {
  mkdir -p "$DIR" && chmod 700 "$DIR"
  [ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "$PREFIX test bed" -f "$DIR/id_ed25519"
  [ -f "$DIR/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/ssh_host_ed25519_key"
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  # Client settings for ssh run inside the hosts (ip netns exec binds
  # /etc/netns/<ns>/ssh over /etc/ssh): a known_hosts of the test bed's own,
  # and keep-alives so a cut link ends an ssh session in 15 s instead of never.
  # Port and key are left to horovodrun's --ssh-port and --ssh-identity-file.
  cat >"$DIR/ssh_config" <<EOF
Host *
  UserKnownHostsFile $DIR/known_hosts
  StrictHostKeyChecking no
  BatchMode yes
  ConnectTimeout 10
  ServerAliveInterval 5
  ServerAliveCountMax 3
  LogLevel ERROR
EOF
}

start_sshd() {
  local host=$1 address
  address=$(host_address "$host")
  mkdir -p /run/sshd "$DIR/$host"  # /run/sshd: sshd's privilege-separation directory
  cat >"$DIR/$host/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress $address
HostKey $DIR/ssh_host_ed25519_key
PidFile $DIR/$host/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
ClientAliveInterval 5
ClientAliveCountMax 3
MaxStartups 100
MaxSessions 100
EOF
  in_host "$host" /usr/sbin/sshd -f "$DIR/$host/sshd_config" -E "$DIR/$host/sshd.log"
  local deadline=$((SECONDS + 30))  # the daemon writes its pid file a moment later
  until [ -s "$DIR/$host/sshd.pid" ]; do
    [ $SECONDS -lt $deadline ] || die "sshd on $host did not start (see $DIR/$host/sshd.log)"
    sleep 0.1
  done
  if [ -f "$DIR/$host/cpu" ]; then  # what ssh starts on this host runs on its core
    taskset -a -p -c "$(cat "$DIR/$host/cpu")" "$(cat "$DIR/$host/sshd.pid")" >/dev/null
  fi
}

stop_sshd() {
  local pidfile=$DIR/$1/sshd.pid
  if [ -f "$pidfile" ]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  fi
}

up() {
  local n=$1 pin=${2:-}
  [[ $n =~ ^[1-8]$ ]] || die "up N: N must be 1..8, not '$n'"
  local reason
  reason=$(check) || die "$reason"
  down
  write_ssh_files
  ip netns add "$BRIDGE_NS"
  ip -n "$BRIDGE_NS" link add br0 type bridge
  ip -n "$BRIDGE_NS" link set br0 up
  local i host ns hosts_file=$DIR/etc_hosts cores
  cores=$(nproc)
  printf '127.0.0.1\tlocalhost\n' >"$hosts_file"
  for ((i = 0; i < n; i++)); do
    host=$(host_name "$i")
    printf '%s\t%s\n' "$(host_address "$host")" "$host" >>"$hosts_file"
  done
  : >"$DIR/hosts"
  for ((i = 0; i < n; i++)); do
    host=$(host_name "$i"); ns=$(host_ns "$host")
    ip netns add "$ns"
    echo "$host" >>"$DIR/hosts"
    # Both ends are created inside namespaces: neither ever exists in the root one.
    ip -n "$BRIDGE_NS" link add "p-$host" type veth peer name eth0 netns "$ns"
    ip -n "$BRIDGE_NS" link set "p-$host" master br0 up
    ip -n "$ns" addr add "$(host_address "$host")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns/ssh"
    cp "$hosts_file" "/etc/netns/$ns/hosts"
    cp "$DIR/ssh_config" "/etc/netns/$ns/ssh/ssh_config"
    mkdir -p "$DIR/$host"
    [ "$pin" != --pin ] || echo $((i % cores)) >"$DIR/$host/cpu"
    start_sshd "$host"
  done
  wait_for_sshd
  echo "hosts: up $(tr '\n' ' ' <"$DIR/hosts")(ssh port $SSH_PORT, key $DIR/id_ed25519)"
}

wait_for_sshd() {  # every host reaches every other host's sshd, or a clear error
  local from to deadline=$((SECONDS + 60))
  for from in $(hosts_up); do
    for to in $(hosts_up); do
      until in_host "$from" ssh -p "$SSH_PORT" -i "$DIR/id_ed25519" "$to" true 2>/dev/null; do
        [ $SECONDS -lt $deadline ] || die "$from cannot ssh to $to (see $DIR/$to/sshd.log)"
        sleep 0.2
      done
    done
  done
}

down() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
    # Everything still running in a test host (sshd, trainers) was started by the test bed.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  rm -rf "$DIR"
}

shape() {
  local rate=$1 delay=${2:-0ms} host ns
  [ -n "$(hosts_up)" ] || die "no test bed is up (tools/hosts.sh up N)"
  for host in $(hosts_up); do
    ns=$(host_ns "$host")
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    [ "$rate" = off ] && continue
    # Each host's egress: a token bucket at RATE, then DELAY. A host's sends
    # and receives are shaped at its own and its peer's port, as on a switch.
    # The bucket holds 64 KiB at least, since veth passes 64 KiB GSO segments.
    tc -n "$ns" qdisc add dev eth0 root handle 1: tbf rate "$rate" burst 256kb latency 100ms
    # Some kernels (this project's VM among them) are built without netem:
    # then the links get the rate but no added delay, and `shape` says so.
    if ! tc -n "$ns" qdisc add dev eth0 parent 1:1 handle 10: netem delay "$delay" limit 100000 \
        2>/dev/null; then
      no_delay=1
    fi
  done
  if [ "${no_delay:-0}" = 1 ]; then
    echo "hosts: links $rate; no delay: this kernel has no netem qdisc" >&2
  else
    echo "hosts: links ${rate/off/unshaped}${2:+ delay $delay}"
  fi
}

case ${1:-} in
  check) check ;;
  up) up "${2:?up N}" "${3:-}" ;;
  down) down ;;
  shape) shape "${2:?shape RATE DELAY | shape off}" "${3:-}" ;;
  link)
    [ "${3:-}" = up ] || [ "${3:-}" = down ] || die "link HOST down|up"
    ip -n "$(host_ns "${2:?link HOST down|up}")" link set eth0 "$3" ;;
  sshd)
    case ${3:-} in stop) stop_sshd "${2:?}" ;; start) start_sshd "${2:?}" ;; *) die "sshd HOST stop|start" ;; esac ;;
  exec)
    host=${2:?exec HOST CMD...}; shift 2
    if [ -f "$DIR/$host/cpu" ]; then set -- taskset -c "$(cat "$DIR/$host/cpu")" "$@"; fi
    in_host "$host" "$@" ;;
  info)
    echo "HOSTS_DIR=$DIR HOSTS_SSH_PORT=$SSH_PORT HOSTS_SSH_KEY=$DIR/id_ed25519"
    for host in $(hosts_up); do echo "$host=$(host_address "$host")"; done ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
