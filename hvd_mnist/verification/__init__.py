"""`python -m hvd_mnist.verify`: does every host of a cluster compute what one worker computes?

hosts.py turns `--hosts` or a Slurm allocation into a host list; probe.py runs on each
host (over ssh, as horovodrun reaches it) and reports what it has; preflight.py compares
the reports; agreement.py trains a few float64 steps across the hosts and on one worker
and compares the weights; run.py puts them in that order.
"""
