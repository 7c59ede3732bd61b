"""The frozen training configuration, every rule its values must keep, and the
batch/learning-rate arithmetic.

`train_flags.py` builds a `TrainConfig` from the flags once; library code receives it as
an argument and never reads FLAGS, so everything is callable from tests. A config
that breaks a rule cannot be built: `problems` names every broken rule, and the
error is one line naming them all, before Horovod starts. The two rules that need
the number of workers or of training examples are checked where those are known
(`resolve_batching`, `resolve_steps_per_epoch`).
"""

import dataclasses

from hvd_mnist import recipes
from hvd_mnist.errors import UserFacingError

# Per-worker learning rate of each optimizer when --learning_rate is not given.
DEFAULT_LEARNING_RATES = {"adadelta": 1.0, "adam": 0.001, "sgd": 0.01}
OPTIMIZERS = tuple(DEFAULT_LEARNING_RATES)
MODES = ("custom", "keras")
INPUTS = ("memory", "stream", "files")  # see inputs.py
LR_SCHEDULES = ("constant", "warmup_linear")
PROGRESS_MODES = ("auto", "bar", "lines")  # see progress.py
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16", "float64")  # training/precision.py

# The values a field may take: one of CHOICES, or within RANGES (minimum, maximum; None:
# no maximum). The flags' help states them (train_flags.py).
CHOICES = {"mode": MODES, "optimizer": OPTIMIZERS, "recipe": tuple(recipes.RECIPES),
           "lr_schedule": LR_SCHEDULES, "input": INPUTS, "progress": PROGRESS_MODES,
           "precision": PRECISIONS}
RANGES = {"epochs": (1, None), "batch_size": (1, None), "global_batch_size": (0, None),
          "seed": (0, None), "max_steps_per_epoch": (0, None), "log_every": (0, None),
          "keep_checkpoints": (1, None), "threads_per_rank": (0, None),
          "warmup_epochs": (0.0, None), "target_accuracy": (0.0, 1.0),
          "shuffle_buffer": (1, None), "commit_every": (1, None),
          "backward_passes_per_step": (1, None), "checkpoint_every_steps": (0, None),
          "checkpoint_every_minutes": (0.0, None)}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data_dir: str
    model_dir: str
    mode: str = "custom"  # custom: the tf.function loop; keras: the model.fit baseline
    keras_literal: bool = False  # keras mode only: Horovod's example exactly, no sharding
    epochs: int = 12
    batch_size: int = 128  # per worker; ignored when global_batch_size is set
    global_batch_size: int = 0  # 0: batch_size * number of workers
    learning_rate: float | None = None  # per worker; None: the optimizer's default
    optimizer: str = "adadelta"
    seed: int = 42
    max_steps_per_epoch: int = 0  # 0: a full pass over the training split
    resume: bool = False
    log_every: int = 100
    keep_checkpoints: int = 3
    dropout: bool = True
    threads_per_rank: int = 0  # 0: cores / local size
    deterministic: bool = False  # TF op determinism and no tensor fusion: bitwise-repeatable runs
    recipe: str = "seed"  # a named set of defaults (recipes.py); explicit flags win
    lr_schedule: str = "constant"  # or warmup_linear: warm up, then decay to 0 at the last step
    warmup_epochs: float = 0.0  # warmup_linear only
    target_accuracy: float = 0.0  # > 0: stop after the first epoch that reaches it
    input: str = "memory"  # memory, stream or files (inputs.py)
    shuffle_buffer: int = 60000  # stream and files: examples in tf.data's shuffle buffer
    elastic: bool = False  # custom loop under hvd.elastic.run: workers may leave and join
    commit_every: int = 20  # elastic: steps between commits of the state to host memory
    progress: str = "auto"  # bar, lines, or auto: bar when stdout is a terminal
    export: bool = True  # rank 0 writes model_dir/export (a SavedModel) at the end
    fp16_allreduce: bool = False  # gradients cross the network as float16
    precision: str = "float32"  # a Keras mixed policy (bfloat16/float16 compute), or float64
    backward_passes_per_step: int = 1  # local batches whose mean gradient makes one update
    checkpoint_every_steps: int = 0  # > 0: also a mid-epoch checkpoint every this many steps
    checkpoint_every_minutes: float = 0.0  # > 0: also one when this long since the last

    def __post_init__(self):
        found = problems(self)
        if len(found) > 1:
            raise UserFacingError(f"{len(found)} flag values do not work: " + "; ".join(found))
        if found:
            raise UserFacingError(found[0])

    def to_dict(self):
        return dataclasses.asdict(self)


def allowed(name: str) -> str:
    """What a field may hold, in absl's words: "<custom|keras>", "a positive integer"."""
    if name in CHOICES:
        return "<" + "|".join(CHOICES[name]) + ">"
    low, high = RANGES[name]
    kind = "number" if isinstance(low, float) else "integer"
    if high is not None:
        return f"a {kind} in the range [{low}, {high}]"
    return f"a {'positive' if low else 'non-negative'} {kind}"


def problems(config: TrainConfig) -> list[str]:
    """Every rule `config` breaks, one message each: a value outside its field's choices or
    range first (in field order), then the combinations that cannot work."""
    found = []
    for name in (field.name for field in dataclasses.fields(config)):
        value = getattr(config, name)
        if name in CHOICES:
            found.append(_rule(value not in CHOICES[name], message=f"flag --{name}={value}: "
                               f"value should be one of {allowed(name)}"))
        elif name in RANGES:
            low, high = RANGES[name]
            as_given = format(value, "g") if isinstance(value, float) else value
            found.append(_rule(value < low or (high is not None and value > high),
                               message=f"flag --{name}={as_given}: {value} is not {allowed(name)}"))
    return [message for message in found + _combinations(config) if message]


def _rule(broken: bool, message: str) -> str:
    return message if broken else ""


def _combinations(c: TrainConfig) -> list[str]:
    """The messages of the combinations of values that cannot work ("" where it can)."""
    passes = max(c.backward_passes_per_step, 1)  # a value below 1 is reported on its own
    rules = [
        _rule(c.learning_rate is not None and c.learning_rate <= 0,
              message="--learning_rate must be > 0"),
        _rule(c.keras_literal and c.mode != "keras", message="--keras_literal needs --mode=keras"),
        _rule(c.keras_literal and c.input != "memory",
              message="--keras_literal needs --input=memory"),
        _rule(c.resume and c.mode != "custom",
              message="--resume is supported by --mode=custom only"),
        _rule(c.elastic and c.mode != "custom",
              message="--elastic is supported by --mode=custom only"),
        _rule(c.precision == "mixed_float16" and c.backward_passes_per_step != 1,
              message="--precision=mixed_float16 needs --backward_passes_per_step=1: the loss "
                      "scale decides per update whether to skip it, not per accumulated batch"),
        _rule(c.checkpoint_every_steps % passes != 0,
              message="--checkpoint_every_steps must be a multiple of "
                      "--backward_passes_per_step: a checkpoint holds no half-accumulated "
                      "gradient"),
        _rule(c.max_steps_per_epoch % passes != 0,
              message=_not_whole_updates(c.max_steps_per_epoch, c.backward_passes_per_step)),
    ]
    for name in ("checkpoint_every_steps", "checkpoint_every_minutes"):
        rules += [
            _rule(getattr(c, name) and c.mode != "custom",
                  message=f"--{name} needs --mode=custom: the Keras path cannot --resume"),
            _rule(getattr(c, name) and c.elastic,
                  message=f"--{name} is not for --elastic, which commits its state to memory "
                          "every --commit_every steps instead"),
        ]
    if c.elastic:
        rules += [
            _rule(c.input != "memory",
                  message="--elastic needs --input=memory: resharding the rest of an epoch "
                          "after a reset picks examples by their position in the epoch's "
                          "permutation"),
            _rule(c.lr_schedule != "constant",
                  message="--elastic needs --lr_schedule=constant: a schedule counts steps, "
                          "and a resize changes the number of steps per epoch (--recipe=fast "
                          "sets warmup_linear)"),
            _rule(c.backward_passes_per_step > 1,
                  message="--elastic needs --backward_passes_per_step=1: a commit between the "
                          "batches of one update would leave their accumulated gradients out "
                          "of the state"),
        ]
    return rules


def _not_whole_updates(cap: int, passes: int) -> str:
    return (f"--max_steps_per_epoch={cap} is not a multiple of --backward_passes_per_step="
            f"{passes}; an epoch must end with a whole update")


@dataclasses.dataclass(frozen=True)
class Batching:
    """Batch sizes and learning rate once the number of workers is known."""
    per_rank_batch_size: int
    global_batch_size: int
    learning_rate: float


def resolve_batching(config: TrainConfig, size: int) -> Batching:
    """Per-rank and global batch, and the learning rate, for `size` workers.

    With a per-worker batch the global batch grows with size, so the learning
    rate is scaled by size as in Horovod's examples. With a fixed global batch
    the optimisation problem is the same at any size and the rate is kept.
    """
    base_rate = config.learning_rate or DEFAULT_LEARNING_RATES[config.optimizer]
    if config.global_batch_size:
        if config.global_batch_size % size:
            raise UserFacingError(
                f"--global_batch_size={config.global_batch_size} is not divisible by the "
                f"{size} workers; choose a multiple of {size}")
        return Batching(config.global_batch_size // size, config.global_batch_size, base_rate)
    return Batching(config.batch_size, config.batch_size * size, base_rate * size)


def resolve_steps_per_epoch(num_examples: int, global_batch_size: int, cap: int = 0,
                    passes_per_update: int = 1) -> int:
    """Whole global batches in one pass over `num_examples`, optionally capped.

    Every rank runs exactly this many steps, so no rank waits at the end of an
    epoch for a collective that another rank will never join. With gradient
    accumulation an epoch holds whole updates (`passes_per_update` steps each),
    so no half-accumulated gradient outlives an epoch or its checkpoint.
    """
    full = num_examples // global_batch_size
    full -= full % passes_per_update
    if cap % passes_per_update:
        raise UserFacingError(_not_whole_updates(cap, passes_per_update))
    if full == 0:
        raise UserFacingError(
            f"the global batch of {global_batch_size} is larger than the {num_examples} "
            "training examples; lower --batch_size or --global_batch_size")
    if cap > full:
        raise UserFacingError(
            f"--max_steps_per_epoch={cap} is more than one epoch ({full} steps of "
            f"{global_batch_size} examples); lower it or set 0 for a full epoch")
    return cap or full
