"""The trainers: the custom loop, the Keras fit baseline, and elastic training.

model.py builds the network, its loss and optimizers; step.py holds one training
step, the evaluation step and the reduction of metrics over ranks; loop.py the
epoch's steps and end, which the custom and the elastic trainer share, and the custom
trainer's run; hooks.py what a run does at each epoch's start and end and after each
step, for the loop and fit's callbacks alike; preemption.py when all ranks save or stop
mid-epoch; communication.py what goes over the wire (compression, accumulation); job.py
what every trainer does before its first step and after its last; keras_fit.py and
elastic.py reuse those pieces.
"""
