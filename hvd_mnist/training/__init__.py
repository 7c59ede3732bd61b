"""The trainers: the custom loop, the Keras fit baseline, and elastic training.

model.py builds the network, its loss and optimizers; step.py holds one training
step, the evaluation step and the reduction of metrics over ranks; loop.py the epoch
and the run; communication.py what goes over the wire (compression, accumulation);
job.py what every trainer does before its first step and after its last;
keras_fit.py and elastic.py reuse those pieces.
"""
