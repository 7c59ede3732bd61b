"""What the make targets run besides hvd_mnist itself: set-up (setup.sh, pins/,
horovod-patches/), the host test bed (hosts.sh, discover_hosts.sh), the test repeater
(repeat_tests.sh) and the benchmarks and reports (the bench package)."""
