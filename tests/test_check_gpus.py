"""`horovodrun -np N python -m hvd_mnist.check_gpus`, the first command on a GPU host.

Its decisions are tested here with every rank's facts made up; the whole command runs
only on this project's CPU hosts, where it must say that there is no GPU, skip the
NCCL allreduce, and still train one step. Its GPU behaviour is untested (docs/gpus.md).
"""

import math
import sys

import horovod.tensorflow as hvd
import pytest

from hvd_mnist.verification import gpus
from tests.conftest import horovodrun


def facts(*per_rank):
    """RankFacts from (host, local_rank, gpus_on_host) per rank, ranks in order."""
    return [gpus.RankFacts(rank, host, local_rank, count)
            for rank, (host, local_rank, count) in enumerate(per_rank)]


def test_every_rank_with_a_gpu_of_its_own_passes():
    outcome = gpus.check_gpus(facts(("a", 0, 2), ("a", 1, 2), ("b", 0, 2), ("b", 1, 2)))
    assert outcome.status == gpus.PASS
    assert outcome.line() == "PASS gpus: 4 ranks, one GPU each, on 2 hosts"


def test_more_ranks_than_gpus_on_a_host_names_the_ranks_left_without():
    outcome = gpus.check_gpus(facts(("a", 0, 2), ("a", 1, 2), ("a", 2, 2)))
    assert outcome.status == gpus.FAIL
    assert "rank 2 (a, local rank 2) sees 2 GPUs" in outcome.reason
    assert "rank 0" not in outcome.reason and "rank 1 " not in outcome.reason


def test_nccl_version_code_reads_as_a_version():
    assert gpus.nccl_version(23203) == "2.32.3"
    assert gpus.check_nccl(23203).line() == "PASS nccl: Horovod was built with NCCL 2.32.3"
    assert gpus.check_nccl(0).status == gpus.FAIL


def test_allreduce_passes_only_when_every_element_is_the_sum():
    assert gpus.check_allreduce([10.0] * 8, size=4, device="GPU:0").status == gpus.PASS
    wrong = gpus.check_allreduce([10.0] * 7 + [9.0], size=4, device="GPU:0")
    assert wrong.status == gpus.FAIL and wrong.reason.startswith("1 of 8 elements")


def test_step_fails_on_a_non_finite_loss_or_ranks_that_disagree():
    assert gpus.check_step(2.3, ["x", "x"], "GPU:0").status == gpus.PASS
    assert gpus.check_step(math.nan, ["x", "x"], "GPU:0").status == gpus.FAIL
    differing = gpus.check_step(2.3, ["x", "x", "y"], "GPU:0")
    assert differing.status == gpus.FAIL and "ranks [2]" in differing.reason


def test_only_all_ranks_with_gpus_run_the_gpu_allreduce():
    # Otherwise the ranks with a GPU would wait in a collective the others never join.
    assert gpus.every_rank_has_a_gpu(facts(("a", 0, 1), ("b", 0, 1)))
    assert not gpus.every_rank_has_a_gpu(facts(("a", 0, 1), ("a", 1, 1)))


@pytest.mark.horovodrun
def test_on_a_cpu_host_it_reports_no_gpu_skips_nccl_and_still_trains_one_step():
    result = horovodrun(2, [sys.executable, "-m", "hvd_mnist.check_gpus"], timeout=300)
    lines = [line.split("]<stdout>:", 1)[-1] for line in result.stdout.splitlines()
             if "<stdout>:" in line]
    assert result.returncode == 1, result.stdout + result.stderr
    assert [line.split(":")[0] for line in lines] == [
        "FAIL gpus", ("PASS nccl" if hvd.nccl_built() else "FAIL nccl"), "SKIP allreduce",
        "PASS step"]
    assert lines[0].startswith("FAIL gpus: rank 0 (") and "sees 0 GPUs" in lines[0]
    assert "one step on CPU:0 on 2 ranks" in lines[3]
    # Only rank 0 prints them.
    assert all(line.startswith("[0]<stdout>:") for line in result.stdout.splitlines()
               if "<stdout>:" in line)
