"""Checks a cluster before a long run: `python -m hvd_mnist.verify --hosts=hostA:1,hostB:1`.

On the first host of the list (or in a Slurm allocation, without --hosts): first every
host is asked, over ssh as horovodrun reaches it, for its Python, TensorFlow, Keras,
Horovod and hvd_mnist versions, Horovod's build, the prepared data's sha256s, a writable
model_dir with free space, and whether it reaches the other hosts; each problem is one
line naming its host. Then --steps steps in float64 across all the hosts' slots, and on
one worker with the same global batch: one line with the largest weight difference, and
PASS (exit 0) or FAIL (exit 1). model_dir is checked, never written: the runs go to a
temporary directory that is removed afterwards.
"""

import os
import sys

from hvd_mnist.worker import quiet

quiet.before_tensorflow()

from absl import app, flags  # noqa: E402

from hvd_mnist.errors import UserFacingError  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("hosts", "", "Hosts as horovodrun's -H takes them, HOST:SLOTS,... "
                        "(first: this host). Empty: the Slurm allocation this runs in.")
    flags.DEFINE_string("data_dir", "data/tfds", "The prepared mnist, at this path on every "
                        "host.")
    flags.DEFINE_string("model_dir", "runs/mnist", "The model_dir the real run will use: "
                        "checked on every host, never written.")
    flags.DEFINE_string("network_interface", "", "The interface Horovod will use "
                        "(horovodrun's --network-interface), e.g. eth0.")
    flags.DEFINE_integer("ssh_port", 0, "horovodrun's --ssh-port (0: ssh's default).",
                         lower_bound=0)
    flags.DEFINE_string("ssh_identity_file", "", "horovodrun's --ssh-identity-file.")
    flags.DEFINE_enum("controller", "gloo", ["gloo", "mpi"], "How horovodrun starts the "
                      "workers: --gloo, or --mpi where Horovod is built with MPI.")
    flags.DEFINE_integer("steps", 5, "Training steps of each of the two runs.", lower_bound=1)
    flags.DEFINE_integer("timeout_seconds", 600, "Each run ends as a failure after this long.",
                         lower_bound=1)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    quiet.after_flags()
    from hvd_mnist.verification import hosts, run as verification
    try:
        config = verification.VerifyConfig(
            hosts=tuple(hosts.resolve(FLAGS.hosts, os.environ)), data_dir=FLAGS.data_dir,
            model_dir=FLAGS.model_dir, network_interface=FLAGS.network_interface,
            ssh_port=FLAGS.ssh_port, ssh_identity_file=FLAGS.ssh_identity_file,
            controller=FLAGS.controller, steps=FLAGS.steps,
            timeout_seconds=FLAGS.timeout_seconds)
        passed = verification.verify(config)
    except UserFacingError as e:
        print(f"verify: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0 if passed else 1


def run():
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
