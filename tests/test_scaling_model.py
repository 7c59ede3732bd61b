"""tools/bench/scaling_model.py: at two hosts it is make scaling's fit of the measured rows of
reports/scaling.json, and past them it behaves as a ring allreduce must (efficiency falls
with workers and rises with bandwidth, fp16 halves the wire, accumulation divides the
allreduce, fusion saves a latency per tensor); docs/performance.md shows the tables the
command prints."""

import dataclasses
import pathlib

import pytest

from tools.bench import scaling_model as sm
from tools.bench import scaling_tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINKS = [gbit * 1e9 for gbit in scaling_tables.LINKS_GBIT]
# Nothing but the wire: no per-byte stack cost, no latency, no cycle.
WIRE_ONLY = sm.Stack("wire", 0.0, 0.0, overlap=False, cycle_seconds=0.0)


@pytest.fixture(scope="module")
def report():
    return sm.load_report()


@pytest.fixture(scope="module")
def inputs():
    return scaling_tables.hvd_mnist_inputs()


@pytest.fixture(scope="module")
def gradients(inputs):
    return inputs[0]


@pytest.fixture(scope="module")
def cases(report, gradients):
    return scaling_tables.cases(report, gradients)


def test_the_gradients_are_the_models_weights_and_what_the_probe_allreduced(report, gradients):
    from hvd_mnist.training import model as model_lib
    model = model_lib.build_model()
    assert len(gradients) == len(model.trainable_weights)
    assert sum(g.nbytes for g in gradients) == 4 * model.count_params()
    for probe in report["probes"].values():
        assert sum(g.nbytes for g in gradients) == probe["gradient_bytes"]


def test_backward_produces_the_last_layers_gradients_first(gradients):
    ready = [g.ready for g in gradients]
    assert ready == sorted(ready) and ready[-1] == pytest.approx(1.0)
    assert gradients[0].layer == "Dense(10)" and gradients[-1].layer == "Conv2D(32)"
    # The big Dense layer is ready long before the step ends: room to overlap.
    big = max(gradients, key=lambda g: g.nbytes)
    assert big.layer == "Dense(128)" and big.ready < 0.5


def test_at_two_hosts_the_model_is_make_scalings_fit_within_its_target(report, gradients):
    fits = scaling_tables.two_host_fit(report, gradients)
    assert len(fits) == len(report["rows"])
    for (measured, model), row in zip(fits, report["rows"]):
        assert measured == row["step_seconds"]
        assert model == pytest.approx(row["model_step_seconds"], rel=1e-9)
        assert abs(model / measured - 1) <= sm.TWO_HOST_TARGET
    worst = max(abs(model / measured - 1) for measured, model in fits)
    assert worst == pytest.approx(report["targets"]["model_worst_error"], rel=1e-9)


@pytest.mark.parametrize("case", range(3))
def test_efficiency_falls_with_workers(cases, gradients, case):
    _, compute, stack = cases[case]
    for bits in LINKS:
        curve = [sm.efficiency(compute, gradients, n, bits, stack) for n in range(1, 513)]
        assert curve[0] == 1.0
        assert all(b <= a for a, b in zip(curve, curve[1:]))
        assert curve[-1] < curve[7]  # 512 workers against 8


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("workers", [8, 64, 512])
def test_efficiency_rises_with_bandwidth(cases, gradients, case, workers):
    _, compute, stack = cases[case]
    for overlap in (True, False):
        stack_ = dataclasses.replace(stack, overlap=overlap)
        curve = [sm.efficiency(compute, gradients, workers, bits, stack_) for bits in LINKS]
        assert all(b >= a for a, b in zip(curve, curve[1:]))
    serial = dataclasses.replace(stack, overlap=False)
    assert (sm.efficiency(compute, gradients, workers, LINKS[0], serial)
            < sm.efficiency(compute, gradients, workers, LINKS[-1], serial))


@pytest.mark.parametrize("workers", [2, 8, 512])
def test_fp16_halves_the_time_on_the_wire(gradients, workers):
    nbytes = sum(g.nbytes for g in gradients)
    assert sm.wire_seconds(nbytes / 2, workers, 1e10) == sm.wire_seconds(nbytes, workers, 1e10) / 2
    compute = 0.1
    fp32 = sm.step_seconds(compute, gradients, workers, 1e10, WIRE_ONLY) - compute
    fp16 = sm.step_seconds(compute, gradients, workers, 1e10, WIRE_ONLY, "fp16") - compute
    assert fp16 == pytest.approx(fp32 / 2) and fp32 > 0


def test_accumulating_k_batches_divides_what_the_allreduce_adds(cases, gradients):
    _, compute, stack = cases[0]
    once = sm.step_seconds(compute, gradients, 64, 25e9, stack) - compute
    assert sm.step_seconds(compute, gradients, 64, 25e9, stack, passes=4) - compute == (
        pytest.approx(once / 4))


@pytest.mark.parametrize("workers", [2, 64, 512])
def test_without_fusion_every_tensor_pays_the_rings_latency(cases, gradients, workers):
    _, compute, stack = cases[2]
    serial = dataclasses.replace(stack, overlap=False)
    fused = sm.step_seconds(compute, gradients, workers, 25e9, serial)
    per_tensor = sm.step_seconds(compute, gradients, workers, 25e9, serial, fused=False)
    assert per_tensor - fused == pytest.approx(
        (len(gradients) - 1) * sm.ring_latency_seconds(workers, stack.hop_seconds))


def test_overlap_hides_the_dense_layers_gradient_behind_the_convolutions_backward(gradients):
    compute, bits = 0.1, 1e9
    serial = dataclasses.replace(WIRE_ONLY, cycle_seconds=0.001)
    overlapped = dataclasses.replace(serial, overlap=True)
    exposed_serial = sm.step_seconds(compute, gradients, 8, bits, serial) - compute
    assert exposed_serial == pytest.approx(
        0.0005 + sm.wire_seconds(sum(g.nbytes for g in gradients), 8, bits))
    exposed = sm.step_seconds(compute, gradients, 8, bits, overlapped) - compute
    # No more is hidden than the backward left after the big gradient, but nearly that.
    big = max(gradients, key=lambda g: g.nbytes)
    window = (1 - big.ready) * compute
    assert exposed_serial - window - 0.001 <= exposed < exposed_serial / 10


def test_one_worker_has_no_allreduce(cases, gradients):
    for _, compute, stack in cases:
        assert sm.step_seconds(compute, gradients, 1, 1e9, stack) == compute


def test_the_calibrated_stack_reproduces_the_probes_fixed_cost(report, gradients):
    stack = scaling_tables.cases(report, gradients)[0][2]
    compute = 0.1
    for precision in ("fp32", "fp16"):
        added = sm.step_seconds(compute, gradients, 2, None, stack, precision) - compute
        assert added == pytest.approx(report["probes"]["unlimited"][
            f"allreduce_{precision}_seconds"])



def test_the_docs_show_the_tables_the_command_prints(report, inputs):
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    section = page.split("## Past one machine, on paper", 1)[1].split("\n## ", 1)[0]
    printed = scaling_tables.markdown(report, *inputs)
    tables = [line for line in printed.splitlines() if line.startswith("|")]
    assert tables and tables == [line for line in section.splitlines() if line.startswith("|")]
    assert "python -m tools.bench.scaling_tables" in section
