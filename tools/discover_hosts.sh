#!/bin/sh
# Host discovery for elastic training (horovodrun --host-discovery-script): prints the
# hosts file's "host:slots" lines, without comments or blank lines. Horovod runs it about
# every second, so editing the file adds or removes workers.
# The file: $HVD_MNIST_HOSTS_FILE, default elastic_hosts.txt in the current directory.
# On one machine give each slot its own name (localhost:1, 127.0.0.1:1 with
# --network-interface lo): with localhost:2 the driver waits forever for a second host.
hosts_file="${HVD_MNIST_HOSTS_FILE:-elastic_hosts.txt}"
if [ ! -r "$hosts_file" ]; then
    echo "discover_hosts: cannot read $hosts_file (set HVD_MNIST_HOSTS_FILE)" >&2
    exit 1
fi
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$hosts_file" || true
