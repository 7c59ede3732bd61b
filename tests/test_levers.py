"""The slow-network levers on both paths: gradient accumulation computes what one
larger batch computes, and fp16 compression keeps the ranks identical."""

import pytest

from conftest import horovodrun, load_weights, max_abs_difference, trainer_command

# In make test-long: minutes of -np 2 runs for levers only slow links need (make scaling).
pytestmark = [pytest.mark.horovodrun, pytest.mark.long]

# SGD: its update is linear in the gradient, so rounding stays rounding (Adadelta's
# first steps are close to sign(gradient) and flip near-zero ones).
COMMON = ["--epochs=1", "--optimizer=sgd", "--nodropout", "--log_every=0", "--threads_per_rank=1"]


def final_weights(tiny_data_dir, tmp_path, name, *flags):
    out = tmp_path / name
    result = horovodrun(2, trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={out}/model",
        f"--export_weights_dir={out}/weights", *COMMON, *flags))
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [load_weights(out / f"weights/weights_rank{rank}.npz") for rank in (0, 1)]
    assert max_abs_difference(*ranks) == 0.0, "the ranks disagree"
    return ranks[0]


@pytest.mark.parametrize("mode", ["custom", "keras"])
def test_k_accumulated_batches_equal_one_batch_k_times_as_large(tiny_data_dir, tmp_path, mode):
    accumulated = final_weights(tiny_data_dir, tmp_path, "k4", f"--mode={mode}",
                                "--batch_size=8", "--max_steps_per_epoch=4",
                                "--backward_passes_per_step=4")
    one_batch = final_weights(tiny_data_dir, tmp_path, "b32", f"--mode={mode}",
                              "--batch_size=32", "--max_steps_per_epoch=1")
    untrained = final_weights(tiny_data_dir, tmp_path, "none", f"--mode={mode}",
                              "--batch_size=8", "--max_steps_per_epoch=4",
                              "--learning_rate=1e-30", "--backward_passes_per_step=4")
    difference = max_abs_difference(accumulated, one_batch)
    print(f"{mode}: K=4 x 8 vs 1 x 32: {difference:.2e}; "
          f"vs untrained {max_abs_difference(accumulated, untrained):.2e}")
    assert difference < 1e-6
    assert max_abs_difference(accumulated, untrained) > 1e-4, "no update was applied"


@pytest.mark.parametrize("mode", ["custom", "keras"])
def test_fp16_allreduce_trains_and_keeps_the_ranks_identical(tiny_data_dir, tmp_path, mode):
    plain = final_weights(tiny_data_dir, tmp_path, "fp32", f"--mode={mode}", "--batch_size=16",
                          "--max_steps_per_epoch=3")
    fp16 = final_weights(tiny_data_dir, tmp_path, "fp16", f"--mode={mode}", "--batch_size=16",
                         "--max_steps_per_epoch=3", "--fp16_allreduce")
    difference = max_abs_difference(plain, fp16)
    print(f"{mode}: fp16 vs fp32 allreduce after 3 steps: {difference:.2e}")
    assert 0 < difference < 1e-3  # float16 rounding of the gradients, nothing more
