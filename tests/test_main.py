"""The command line: flags, their validation, and the messages a user sees."""

import re
import subprocess
import sys

import pytest
from absl import flags

from hvd_mnist import config, recipes, train_flags
from hvd_mnist.errors import UserFacingError


@pytest.fixture(scope="module")
def parsed_flags():
    if "epochs" not in flags.FLAGS:
        train_flags.define_flags()

    def parse(*argv):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["hvd_mnist", *argv])
        return flags.FLAGS

    yield parse
    flags.FLAGS.unparse_flags()


def test_config_from_flags_carries_every_field(parsed_flags):
    cfg = train_flags.config_from_flags(parsed_flags("--epochs=3", "--global_batch_size=64",
                                                     "--optimizer=adam", "--nodropout",
                                                     "--deterministic", "--commit_every=7"))
    assert isinstance(cfg, config.TrainConfig)
    assert (cfg.epochs, cfg.global_batch_size, cfg.optimizer, cfg.dropout) == (3, 64, "adam", False)
    assert (cfg.deterministic, cfg.commit_every) == (True, 7)
    assert cfg.learning_rate is None and cfg.batch_size == 128


def test_fast_recipe_sets_its_values_and_explicit_flags_win(parsed_flags):
    cfg = train_flags.config_from_flags(parsed_flags("--recipe=fast", "--epochs=5"))
    expected = {**recipes.RECIPES["fast"], "epochs": 5}
    assert {name: getattr(cfg, name) for name in expected} == expected
    seed = train_flags.config_from_flags(parsed_flags())
    assert (seed.optimizer, seed.epochs, seed.lr_schedule) == ("adadelta", 12, "constant")


@pytest.mark.parametrize("flag,message", [
    ("--batch_size=-1", "flag --batch_size=-1: -1 is not a positive integer"),
    ("--epochs=0", "flag --epochs=0: 0 is not a positive integer"),
    ("--learning_rate=-0.5", "--learning_rate must be > 0"),
    ("--optimizer=rmsprop", "flag --optimizer=rmsprop: value should be one of"),
    ("--max_steps_per_epoch=-3", "flag --max_steps_per_epoch=-3"),
    ("--learning_rate=0", "--learning_rate must be > 0"),
])
def test_bad_flag_values_are_rejected_with_the_flag_name(parsed_flags, flag, message):
    with pytest.raises(UserFacingError, match=message.replace("+", r"\+")):
        train_flags.config_from_flags(parsed_flags(flag))


@pytest.mark.parametrize("argv,message", [
    (["--checkpoint_every_steps=10", "--mode=keras"],
     "--checkpoint_every_steps needs --mode=custom: the Keras path cannot --resume"),
    (["--checkpoint_every_minutes=30", "--elastic"],
     "--checkpoint_every_minutes is not for --elastic, which commits its state to memory "
     "every --commit_every steps instead"),
    (["--checkpoint_every_steps=3", "--backward_passes_per_step=2"],
     "--checkpoint_every_steps must be a multiple of --backward_passes_per_step: a "
     "checkpoint holds no half-accumulated gradient"),
    (["--checkpoint_every_minutes=-1"],
     "flag --checkpoint_every_minutes=-1: -1.0 is not a non-negative number"),
])
def test_mid_epoch_checkpoints_are_refused_where_they_cannot_work(parsed_flags, argv,
                                                                 message):
    with pytest.raises(UserFacingError, match=message.replace("+", r"\+")):
        train_flags.config_from_flags(parsed_flags(*argv))
    cfg = train_flags.config_from_flags(parsed_flags("--checkpoint_every_steps=10",
                                                     "--checkpoint_every_minutes=2.5"))
    assert (cfg.checkpoint_every_steps, cfg.checkpoint_every_minutes) == (10, 2.5)


@pytest.mark.parametrize("argv,message", [
    (["--precision=mixed_float16", "--backward_passes_per_step=2"],
     "--precision=mixed_float16 needs --backward_passes_per_step=1: the loss scale decides "
     "per update whether to skip it, not per accumulated batch"),
    (["--precision=float16"], "flag --precision=float16: value should be one of"),
])
def test_precision_is_refused_where_it_cannot_work(parsed_flags, argv, message):
    with pytest.raises(UserFacingError, match=message.replace("+", r"\+")):
        train_flags.config_from_flags(parsed_flags(*argv))
    cfg = train_flags.config_from_flags(parsed_flags("--precision=mixed_bfloat16",
                                                     "--backward_passes_per_step=2"))
    assert (cfg.precision, cfg.backward_passes_per_step) == ("mixed_bfloat16", 2)


def test_every_bad_value_is_named_in_one_line(parsed_flags):
    with pytest.raises(UserFacingError) as raised:
        train_flags.config_from_flags(parsed_flags(
            "--epochs=0", "--optimizer=rmsprop", "--target_accuracy=99", "--keras_literal"))
    assert str(raised.value) == (
        "4 flag values do not work: flag --epochs=0: 0 is not a positive integer; "
        "flag --optimizer=rmsprop: value should be one of <adadelta|adam|sgd>; "
        "flag --target_accuracy=99: 99.0 is not a number in the range [0.0, 1.0]; "
        "--keras_literal needs --mode=keras")


def test_a_recipe_value_breaking_a_rule_is_named_with_the_others(parsed_flags):
    with pytest.raises(UserFacingError, match=r"^2 flag values do not work: flag --seed=-1: .*; "
                                              r"--elastic needs --lr_schedule=constant"):
        train_flags.config_from_flags(parsed_flags("--recipe=fast", "--elastic", "--seed=-1"))


def run_main(*argv):
    return subprocess.run([sys.executable, "-m", "hvd_mnist.main", *argv],
                          capture_output=True, text=True, timeout=120)


def test_bad_flag_exits_non_zero_naming_the_flag():
    result = run_main("--batch_size=-1")
    assert result.returncode != 0
    assert "flag --batch_size=-1" in result.stderr


def test_several_bad_values_exit_with_one_line_before_anything_starts(tmp_path):
    result = run_main("--batch_size=0", "--precision=float16", "--resume", "--mode=keras",
                      f"--model_dir={tmp_path}/m")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "hvd_mnist: error: 3 flag values do not work: flag --batch_size=0: 0 is not a positive "
        "integer; flag --precision=float16: value should be one of "
        "<float32|mixed_bfloat16|mixed_float16|float64>; "
        "--resume is supported by --mode=custom only"]
    assert not (tmp_path / "m").exists()


def test_missing_data_dir_names_the_prepare_command(tmp_path):
    result = run_main(f"--data_dir={tmp_path}/nonexistent", f"--model_dir={tmp_path}/m")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"hvd_mnist: error: no prepared TFDS mnist 3.0.1 in '{tmp_path}/nonexistent'; prepare it "
        f"with: make data (or: python -m hvd_mnist.prepare --data_dir={tmp_path}/nonexistent)"]
    assert not (tmp_path / "m").exists()


def test_helpfull_lists_no_testing_aid():
    """The testing aids are flags of tests/with_aids.py, not of the product."""
    listed = set(re.findall(r"^\s+--(?:\[no\])?(\w+)", run_main("--helpfull").stdout, re.M))
    assert {"epochs", "precision", "elastic"} <= listed
    assert not listed & {"inject_nan_at_step", "inject_overflow_at_step", "export_weights_dir",
                         "example_log", "float64"}
