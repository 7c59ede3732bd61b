"""Device and thread set-up. No GPU here: a fake tf.config stands in for one."""

import types

import pytest

from hvd_mnist.worker import runtime


class FakeTfConfig:
    """Records what runtime asks of tf.config, for a host with `num_gpus` GPUs."""

    def __init__(self, num_gpus):
        self.gpus = [f"GPU:{i}" for i in range(num_gpus)]
        self.memory_growth = {}
        self.visible = None
        self.threads = {}
        self.experimental = types.SimpleNamespace(set_memory_growth=self.memory_growth.__setitem__)
        self.threading = types.SimpleNamespace(
            set_intra_op_parallelism_threads=lambda n: self.threads.__setitem__("intra", n),
            set_inter_op_parallelism_threads=lambda n: self.threads.__setitem__("inter", n))

    def list_physical_devices(self, kind):
        assert kind == "GPU"
        return list(self.gpus)

    def set_visible_devices(self, device, kind):
        assert kind == "GPU"
        self.visible = device


def test_each_rank_sees_only_its_local_gpu_with_memory_growth():
    fake = FakeTfConfig(num_gpus=4)
    assert runtime.configure_gpus(local_rank=2, tf_config=fake) == ["GPU:2"]
    assert fake.visible == "GPU:2"
    assert fake.memory_growth == {g: True for g in fake.gpus}


def test_cpu_host_configures_no_gpu():
    fake = FakeTfConfig(num_gpus=0)
    assert runtime.configure_gpus(local_rank=0, tf_config=fake) == []
    assert fake.visible is None


def test_more_ranks_than_gpus_is_an_error():
    with pytest.raises(RuntimeError, match="local rank 2 has no GPU: this host has 2"):
        runtime.configure_gpus(local_rank=2, tf_config=FakeTfConfig(num_gpus=2))


@pytest.mark.parametrize("requested,local_size,cpus,expected", [
    (0, 1, 2, 2), (0, 2, 2, 1), (0, 4, 2, 1), (0, 2, 16, 8), (3, 4, 2, 3)])
def test_threads_per_rank_shares_cores(requested, local_size, cpus, expected):
    assert runtime.threads_per_rank(requested, local_size, cpus) == expected


def test_configure_threads_sets_both_pools():
    fake = FakeTfConfig(num_gpus=0)
    runtime.configure_threads(1, tf_config=fake)
    assert fake.threads == {"intra": 1, "inter": 1}


def test_deterministic_turns_off_tensor_fusion_and_on_op_determinism():
    calls = []
    fake = types.SimpleNamespace(experimental=types.SimpleNamespace(
        enable_op_determinism=lambda: calls.append("op determinism")))
    environ = {"HOROVOD_FUSION_THRESHOLD": "67108864"}
    runtime.configure_determinism(True, environ=environ, tf_config=fake)
    assert environ == {"HOROVOD_FUSION_THRESHOLD": "0"} and calls == ["op determinism"]
    environ = {}
    runtime.configure_determinism(False, environ=environ, tf_config=fake)
    assert environ == {} and calls == ["op determinism"]


def test_cpu_hosts_get_a_5ms_horovod_cycle_unless_the_user_chose_one():
    environ = {}
    runtime.configure_cycle_time(has_gpu=False, environ=environ)
    assert environ == {"HOROVOD_CYCLE_TIME": "5"}
    environ = {"HOROVOD_CYCLE_TIME": "0.5"}  # exported, or horovodrun's --cycle-time-ms
    runtime.configure_cycle_time(has_gpu=False, environ=environ)
    assert environ == {"HOROVOD_CYCLE_TIME": "0.5"}
    environ = {}
    runtime.configure_cycle_time(has_gpu=True, environ=environ)  # Horovod's own 1 ms
    assert environ == {}

