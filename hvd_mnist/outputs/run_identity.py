"""What a checkpoint belongs to: the settings saved with it, and what a resume may change.

Every checkpoint carries a record of its run (`of_run`). Before `--resume`
restores anything, `check_resume` compares that record with the new run:
settings that decide what the saved variables mean must be equal, settings
that only steer the rest of the run may change, and the changes that make the
result differ from an uninterrupted run are named in one log line.
"""

import json

from hvd_mnist import config as config_lib
from hvd_mnist.errors import UserFacingError
from hvd_mnist.worker import keras_compat

# What the saved variables mean. Optimizer slots are saved as a list, so another
# optimizer with slots of the same shapes would restore silently into the wrong ones.
# A mixed_float16 checkpoint also holds the loss scale, which no other precision has.
# bfloat16 and float32 save the same float32 variables, but a resume between them is
# refused too: their steps round differently, and a run that changed precision half-way
# is rarely what was meant (docs/precision.md).
BINDING_FLAGS = ("mode", "optimizer", "precision")
# What a record written before a setting existed meant by it.
OLDER_RECORDS = {"precision": "float32"}
BINDING_STRUCTURE = {  # key: how a person would name it
    "model_variables": "the model's variables",
    "optimizer_hyperparameters": "the optimizer's hyper-parameters",
    "optimizer_variables": "the optimizer's variables",
}
# May change on resume, but then the run no longer equals an uninterrupted one.
# (-np alone is not among them: with --global_batch_size it changes only rounding; with
# a per-worker batch it changes the global batch and the scaled rate, which are.)
RESULT_CHANGING = ("global_batch_size", "learning_rate", "lr_schedule", "warmup_epochs",
                   "seed", "dropout", "steps_per_epoch", "backward_passes_per_step",
                   "fp16_allreduce", "input")
# Everything else may change freely: -np, epochs (but see below), log_every,
# keep_checkpoints, threads_per_rank, data_dir, deterministic, target_accuracy, ...

# Keras records these in an optimizer's config, but they say how it runs, not what its
# variables mean.
_NOT_HYPERPARAMETERS = ("name", "learning_rate", "jit_compile", "is_legacy_optimizer")


def of_run(config: config_lib.TrainConfig, batching: config_lib.Batching, num_workers: int,
           steps_per_epoch: int, model, optimizer) -> dict:
    """The record saved with every checkpoint of this run (JSON-serialisable)."""
    # The wrapped optimizer's: a LossScaleOptimizer's config nests it, learning rate and all.
    hyperparameters = {k: v for k, v in keras_compat.unscaled_optimizer(optimizer)
                       .get_config().items() if k not in _NOT_HYPERPARAMETERS}
    return {
        "mode": config.mode,
        "optimizer": config.optimizer,
        "precision": config.precision,
        "optimizer_hyperparameters": hyperparameters,
        "optimizer_variables": _shapes(optimizer.variables),
        "model_variables": _shapes(model.variables),
        "global_batch_size": batching.global_batch_size,
        "per_rank_batch_size": batching.per_rank_batch_size,
        "num_workers": num_workers,
        "learning_rate": batching.learning_rate,
        "lr_schedule": config.lr_schedule,
        "warmup_epochs": config.warmup_epochs,
        "epochs": config.epochs,
        "seed": config.seed,
        "dropout": config.dropout,
        "steps_per_epoch": steps_per_epoch,
        "backward_passes_per_step": config.backward_passes_per_step,
        "fp16_allreduce": config.fp16_allreduce,
        "input": config.input,
    }


def _shapes(variables) -> list:
    # Shapes in order, not names: Keras numbers layer names per process (dense, dense_1, ...).
    return [list(v.shape) for v in variables]


def to_json(record: dict) -> str:
    return json.dumps(record, sort_keys=True)


def from_json(text: str) -> dict:
    return json.loads(text)


def check_resume(saved: dict, requested: dict, checkpoint_path: str) -> str:
    """Raises if the checkpoint belongs to another run; else describes what the resume changes.

    Returns "" when the resumed run continues exactly what the saved run would
    have done, else one line naming every setting whose change alters the result.
    """
    saved = {**OLDER_RECORDS, **saved}
    if saved.pop("float64", False):  # older records name float64 in a key of its own
        saved["precision"] = "float64"
    mismatches = [f"--{name} was {saved.get(name)}, now {requested[name]}"
                  for name in BINDING_FLAGS if saved.get(name) != requested[name]]
    if not mismatches:  # with other flags the structure differs anyway; name the flags only
        mismatches = [_structure_difference(label, saved.get(key), requested[key])
                      for key, label in BINDING_STRUCTURE.items()
                      if saved.get(key) != requested[key]]
    if mismatches:
        same_flags = " ".join(f"--{name}={saved.get(name)}" for name in BINDING_FLAGS
                              if saved.get(name) != requested[name])
        fix = (f"resume with {same_flags}" if same_flags else
               "resume with the hvd_mnist version that wrote it")
        raise UserFacingError(
            f"cannot resume from {checkpoint_path}: it belongs to another run ("
            + "; ".join(mismatches) + f"); {fix}, or start afresh with another --model_dir")

    changes = [_describe_change(name, saved, requested)
               for name in RESULT_CHANGING if saved.get(name) != requested[name]]
    # The schedule of a warmup_linear run ends at its last epoch; moving it changes every rate.
    if requested["lr_schedule"] != "constant" and saved.get("epochs") != requested["epochs"]:
        changes.append(_describe_change("epochs", saved, requested))
    if not changes:
        return ""
    return ("resume changes " + ", ".join(changes)
            + ": the result will differ from an uninterrupted run")


def check_mid_epoch_resume(saved: dict, requested: dict, checkpoint_path: str) -> None:
    """A mid-epoch position counts steps of one global batch: it means the same examples
    only with the same global batch and steps per epoch."""
    differing = [f"{name} was {saved.get(name)}, now {requested[name]}"
                 for name in ("global_batch_size", "steps_per_epoch")
                 if saved.get(name) != requested[name]]
    if differing:
        raise UserFacingError(
            f"cannot resume mid-epoch from {checkpoint_path}: its position counts steps of "
            f"the run that wrote it ({'; '.join(differing)}); resume with that run's batch, "
            "-np and --max_steps_per_epoch, or delete the mid_epoch directory to resume from "
            "the last epoch checkpoint")


def _describe_change(name: str, saved: dict, requested: dict) -> str:
    change = f"{name} from {saved.get(name)} to {requested[name]}"
    if name == "global_batch_size":
        change += (f" ({saved.get('num_workers')} x {saved.get('per_rank_batch_size')} -> "
                   f"{requested['num_workers']} x {requested['per_rank_batch_size']})")
    return change


def _structure_difference(label: str, saved, requested) -> str:
    if saved is None:
        return f"{label} are not recorded (a checkpoint of an older hvd_mnist)"
    if isinstance(saved, list):
        if len(saved) != len(requested):
            return f"{label} differ: {len(saved)} saved, {len(requested)} now"
        index, a, b = next((i, a, b) for i, (a, b) in enumerate(zip(saved, requested)) if a != b)
        return f"{label} differ: number {index + 1} has shape {a} saved, {b} now"
    return f"{label} differ: saved {saved}, now {requested}"
