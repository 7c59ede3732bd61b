"""Mixed precision proved with real runs: at one worker the custom loop computes what Keras
fit computes, bit for bit, in every precision; bfloat16 results do not depend on -np beyond
a bound measured in the same session from bfloat16's own rounding on this CPU, which the
planted bugs exceed; and a float16 step that overflows
on one rank only is skipped by every rank, which all lower the loss scale together.

The runs are test_parity.py's: dropout off, seed fixed, global batch 64, tiny dataset.
"""

import os
import sys

import numpy as np
import pytest

from conftest import horovodrun, load_weights, max_abs_difference, trainer_command
from hvd_mnist import config as config_lib
from test_parity import COMMON, TEN_STEPS, compare, fraction_beyond, report, train_weights

pytestmark = pytest.mark.horovodrun

TWENTY_STEPS = ["--epochs=4", "--max_steps_per_epoch=5"]  # crosses epoch boundaries too
# float16 runs on Eigen's CPU kernels (oneDNN has none for it here): seconds per step on
# TF 2.15, so its runs are 4 steps, still across an epoch boundary.
FOUR_STEPS = ["--epochs=2", "--max_steps_per_epoch=2"]
STEPS = {"float32": TWENTY_STEPS, "mixed_bfloat16": TWENTY_STEPS, "mixed_float16": FOUR_STEPS}


# float64's agreement is test_parity.py's.
@pytest.mark.parametrize("precision", [p for p in config_lib.PRECISIONS if p != "float64"])
def test_custom_loop_equals_keras_fit_bitwise_at_one_worker(tiny_data_dir, tmp_path,
                                                            record_property, precision):
    flags = [f"--precision={precision}", *STEPS[precision]]
    custom = train_weights(tiny_data_dir, tmp_path, "custom", 1, *flags)
    keras = train_weights(tiny_data_dir, tmp_path, "keras", 1, "--mode=keras", *flags)
    report(record_property, f"{precision}_custom_vs_keras_np1",
           max_abs_difference(custom, keras))
    assert all(w.dtype == np.float32 for w in custom)
    # The same ops in the same order: the loss scaled, the gradients averaged (by 1),
    # checked, unscaled and applied by the same LossScaleOptimizer code.
    assert all(np.array_equal(a, b) for a, b in zip(custom, keras))


BFLOAT16 = ["--precision=mixed_bfloat16", *TEN_STEPS]
# bfloat16 keeps 8 significant bits, so another per-worker batch (another kernel, another
# summation order) moves activations and gradients by about 2^-9 of their size, where
# float32 moves them by 2^-24; Adadelta's sign-like first steps (about 1.4e-3 each, see
# test_parity.py) then flip for more weights. How many depends on the CPU's arithmetic:
# without AVX-512, TensorFlow's own kernels emulate bfloat16 and round elsewhere than oneDNN
# does where the CPU has it. So the bound
# is measured in the same session: the fraction of weights that bfloat16's own rounding
# moves beyond 1e-4 (the one-worker run in float32 against the same run in bfloat16), times
# NOISE_FLOOR_MULTIPLE. A planted bug must exceed that bound BUG_MARGIN times over.
# Measured (seed 3, 10 steps, TF 2.21, against the one-worker custom loop): on the AVX2-only
# EPYC, where bfloat16 is emulated, the noise floor 7.4%, -np 2 4.1% and -np 4 6.9% (custom
# and Keras alike), the planted bugs 65.7-73.0%; the same figures on the AVX512-BF16 EPYC
# under make test-avx2-arithmetic. In native bfloat16 on that EPYC: floor 9.9%, -np 2 1.6%,
# -np 4 0.9%, the bugs 65.7-72.9%; on the AMX Xeon, -np 2 and 4 0.1-1.6%, the bugs 63-73%.
BFLOAT16_TOLERANCE = 1e-4
NOISE_FLOOR_MULTIPLE = 2
BUG_MARGIN = 2


@pytest.fixture(scope="module")
def bfloat16_reference(tiny_data_dir, tmp_path_factory):
    return train_weights(tiny_data_dir, tmp_path_factory.mktemp("bfloat16_reference"),
                         "custom_np1_bfloat16", 1, *BFLOAT16)


@pytest.fixture(scope="module")
def bfloat16_noise_floor(bfloat16_reference, float32_reference_weights):
    """The fraction of weights beyond BFLOAT16_TOLERANCE between the one-worker run in
    float32 and the same run in bfloat16: what rounding alone does on this CPU."""
    return fraction_beyond(float32_reference_weights, bfloat16_reference, BFLOAT16_TOLERANCE)


def bfloat16_bound(record_property, noise_floor):
    record_property("bfloat16_noise_floor", noise_floor)
    print(f"  bfloat16 noise floor (float32 vs bfloat16, one worker): {noise_floor:.5f}")
    return NOISE_FLOOR_MULTIPLE * noise_floor


@pytest.mark.parametrize("mode,np_", [("custom", 2), ("custom", 4), ("keras", 2), ("keras", 4)])
def test_in_bfloat16_results_do_not_depend_on_workers_or_path(
        tiny_data_dir, tmp_path, bfloat16_reference, bfloat16_noise_floor, record_property,
        mode, np_):
    weights = train_weights(tiny_data_dir, tmp_path, f"{mode}_np{np_}", np_, f"--mode={mode}",
                            *BFLOAT16)
    _, off = compare(record_property, f"bfloat16_{mode}_np{np_}_vs_custom_np1_10_steps",
                     bfloat16_reference, weights, BFLOAT16_TOLERANCE)
    bound = bfloat16_bound(record_property, bfloat16_noise_floor)
    assert off <= bound, (
        f"{off:.2%} of weights beyond {BFLOAT16_TOLERANCE:g} of the one-worker run; bfloat16's "
        f"own rounding moves {bfloat16_noise_floor:.2%} here (float32 against bfloat16 at one "
        f"worker), so at most {NOISE_FLOOR_MULTIPLE} times that, {bound:.2%}, may")


@pytest.mark.parametrize("bug,mode", [
    ("sum_gradients", "custom"), ("local_gradients", "keras"), ("no_sharding", "custom")])
def test_in_bfloat16_the_checks_catch_a_broken_trainer(
        tiny_data_dir, tmp_path, bfloat16_reference, bfloat16_noise_floor, record_property,
        bug, mode):
    broken = [sys.executable, os.path.join(os.path.dirname(__file__), "broken_trainer.py"), bug]
    weights = train_weights(tiny_data_dir, tmp_path, bug, 2, f"--mode={mode}", *BFLOAT16,
                            command=broken)
    _, off = compare(record_property, f"bfloat16_broken_{bug}_{mode}_np2_vs_custom_np1",
                     bfloat16_reference, weights, BFLOAT16_TOLERANCE)
    bound = bfloat16_bound(record_property, bfloat16_noise_floor)
    assert off > BUG_MARGIN * bound, (
        f"the planted bug moved only {off:.2%} of weights beyond {BFLOAT16_TOLERANCE:g}, not "
        f"{BUG_MARGIN} times the bound of {bound:.2%} ({NOISE_FLOOR_MULTIPLE} times the "
        f"{bfloat16_noise_floor:.2%} that bfloat16's rounding moves): the check could not "
        f"tell it from a correct run")


def every_rank(directory, np_):
    weights = [load_weights(directory / f"weights_rank{r}.npz") for r in range(np_)]
    optimizers = [dict(np.load(directory / f"optimizer_rank{r}.npz")) for r in range(np_)]
    return weights, optimizers


@pytest.mark.parametrize("mode", ["custom", "keras"])
def test_in_float16_an_overflow_on_one_rank_is_skipped_by_every_rank(tiny_data_dir, tmp_path,
                                                                    mode):
    out = tmp_path / "weights"
    result = horovodrun(2, trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}/model", f"--mode={mode}",
        f"--export_weights_dir={out}", *COMMON, *FOUR_STEPS, "--precision=mixed_float16",
        "--inject_overflow_at_step=3"), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(
        "precision mixed_float16: layers compute in float16; variables, the last layer and the "
        "loss in float32; gradients cross the network as float32, the loss scaled "
        "dynamically") == 1, result.stdout[-3000:]  # rank 0's line only
    weights, optimizers = every_rank(out, 2)
    assert all(np.isfinite(w).all() for w in weights[0])
    assert all(np.array_equal(a, b) for a, b in zip(*weights)), "the ranks diverged"
    # One halving from Keras's 2**15 on both ranks (step 4 then applies); 2000 finite steps
    # would double it.
    assert [float(o["loss_scale"]) for o in optimizers] == [2.0 ** 14] * 2
