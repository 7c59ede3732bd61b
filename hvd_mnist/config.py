"""The frozen training configuration, and the batch/learning-rate arithmetic.

`main.py` builds a `TrainConfig` from flags once; library code receives it as
an argument and never reads FLAGS, so everything is callable from tests.
"""

import dataclasses

from hvd_mnist.errors import UserFacingError

# Per-worker learning rate of each optimizer when --learning_rate is not given.
DEFAULT_LEARNING_RATES = {"adadelta": 1.0, "adam": 0.001, "sgd": 0.01}
OPTIMIZERS = tuple(DEFAULT_LEARNING_RATES)
MODES = ("custom", "keras")
INPUTS = ("memory", "stream", "files")  # see inputs.py
LR_SCHEDULES = ("constant", "warmup_linear")
PROGRESS_MODES = ("auto", "bar", "lines")  # see progress.py
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16", "float64")  # training/precision.py

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

    def to_dict(self):
        return dataclasses.asdict(self)


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
        raise UserFacingError(
            f"--max_steps_per_epoch={cap} is not a multiple of --backward_passes_per_step="
            f"{passes_per_update}; an epoch must end with a whole update")
    if full == 0:
        raise UserFacingError(
            f"the global batch of {global_batch_size} is larger than the {num_examples} "
            "training examples; lower --batch_size or --global_batch_size")
    if cap > full:
        raise UserFacingError(
            f"--max_steps_per_epoch={cap} is more than one epoch ({full} steps of "
            f"{global_batch_size} examples); lower it or set 0 for a full epoch")
    return cap or full
