"""Mixed precision proved with real runs: at one worker the custom loop computes what Keras
fit computes, bit for bit, in every precision; bfloat16 results do not depend on -np beyond
a measured tolerance that the planted bugs still exceed; and a float16 step that overflows
on one rank only is skipped by every rank, which all lower the loss scale together.

The runs are test_parity.py's: dropout off, seed fixed, global batch 64, tiny dataset.
"""

import os
import sys

import numpy as np
import pytest

from conftest import horovodrun, load_weights, max_abs_difference, trainer_command
from hvd_mnist import config as config_lib
from test_parity import COMMON, TEN_STEPS, compare, report, train_weights

pytestmark = pytest.mark.horovodrun

TWENTY_STEPS = ["--epochs=4", "--max_steps_per_epoch=5"]  # crosses epoch boundaries too
# float16 runs on Eigen's CPU kernels (oneDNN has none for it here): seconds per step on
# TF 2.15, so its runs are 4 steps, still across an epoch boundary.
FOUR_STEPS = ["--epochs=2", "--max_steps_per_epoch=2"]
STEPS = {"float32": TWENTY_STEPS, "mixed_bfloat16": TWENTY_STEPS, "mixed_float16": FOUR_STEPS}


@pytest.mark.parametrize("precision", config_lib.PRECISIONS)
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
# test_parity.py) then flip for more weights. Measured on TF 2.21 and 2.15 (seed 3, 10
# steps, against the one-worker custom loop): at -np 2 and 4, custom and Keras alike,
# 0.1-1.6% of weights beyond 1e-4, the largest 2e-3. The planted bugs: 63-73% beyond 1e-4,
# the largest 1e-2 to 1.4e-2 (summed gradients are among the weakest: Adadelta's step hardly
# depends on the gradient's scale). The bound sits 3x above the first and 10x below the second.
BFLOAT16_TOLERANCE = 1e-4
BFLOAT16_MAX_FRACTION_OFF = 0.05


@pytest.fixture(scope="module")
def bfloat16_reference(tiny_data_dir, tmp_path_factory):
    return train_weights(tiny_data_dir, tmp_path_factory.mktemp("bfloat16_reference"),
                         "custom_np1_bfloat16", 1, *BFLOAT16)


@pytest.mark.parametrize("mode,np_", [("custom", 2), ("custom", 4), ("keras", 2), ("keras", 4)])
def test_in_bfloat16_results_do_not_depend_on_workers_or_path(
        tiny_data_dir, tmp_path, bfloat16_reference, record_property, mode, np_):
    weights = train_weights(tiny_data_dir, tmp_path, f"{mode}_np{np_}", np_, f"--mode={mode}",
                            *BFLOAT16)
    _, off = compare(record_property, f"bfloat16_{mode}_np{np_}_vs_custom_np1_10_steps",
                     bfloat16_reference, weights, BFLOAT16_TOLERANCE)
    assert off <= BFLOAT16_MAX_FRACTION_OFF


@pytest.mark.parametrize("bug,mode", [
    ("sum_gradients", "custom"), ("local_gradients", "keras"), ("no_sharding", "custom")])
def test_in_bfloat16_the_checks_catch_a_broken_trainer(
        tiny_data_dir, tmp_path, bfloat16_reference, record_property, bug, mode):
    broken = [sys.executable, os.path.join(os.path.dirname(__file__), "broken_trainer.py"), bug]
    weights = train_weights(tiny_data_dir, tmp_path, bug, 2, f"--mode={mode}", *BFLOAT16,
                            command=broken)
    _, off = compare(record_property, f"bfloat16_broken_{bug}_{mode}_np2_vs_custom_np1",
                     bfloat16_reference, weights, BFLOAT16_TOLERANCE)
    assert off > 10 * BFLOAT16_MAX_FRACTION_OFF


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
