"""What the make targets run besides hvd_mnist itself: set-up (setup.sh, pins/,
horovod-patches/), the host test bed (hosts.sh, discover_hosts.sh), the test repeater
(repeat_tests.sh), the benchmarks (the bench package) and the reports of correctness and
curves: parity.py (make parity) and plot.py (make plot)."""
