"""The recipes, `--recipe=NAME`: named sets of flag values, and what each costs.

A recipe sets the flags it names unless they are given on the command line.
Costs are training seconds to 99.0% test accuracy at -np 2 on the 2-core Intel Xeon with
AMX, float32 (docs/performance.md, "Against the machine's peak": 2e0e69b's make bench;
reports/fast_recipe.md):

| recipe | what it is                                               | to 99.0%         |
|--------|----------------------------------------------------------|------------------|
| seed   | Horovod's Keras example: Adadelta, rate 1.0 x workers,   | 142 s, epoch 5   |
|        | 128 per worker, 12 epochs, dropout (the flags' defaults) | (of 12)          |
| fast   | Adam, peak rate 0.004 per worker, 0.2 epoch of warm-up,  | 54 s, epoch 2    |
|        | linear decay to 0, 2 epochs, no dropout                  | (27 s in bf16)   |

fast was chosen at -np 2 as the fewest training seconds to 99.0% that held for three
seeds: two epochs without dropout, which would hold back a run this short, at the batch
per worker where the step runs fastest per image. Its margin is small (99.02-99.09%).
"""

RECIPES = {
    "seed": {},
    "fast": {"optimizer": "adam", "learning_rate": 0.004, "batch_size": 128, "epochs": 2,
             "lr_schedule": "warmup_linear", "warmup_epochs": 0.2, "dropout": False},
}
