"""The benchmarks and reports of the make targets, run from the repository root:

    python -m tools.bench                  make bench    reports/bench.json, bench.md
    python -m tools.bench.stacks           make bench-stacks  reports/bench_stacks.json, .md
    python -m tools.bench --parts=torch    make bench-torch   bench_torch.json, .md in reports/
    python -m tools.bench.step_profile     make step-profile  one step, TF beside PyTorch
    python -m tools.bench.parity           make parity   reports/parity.json, parity.md
    python -m tools.bench.scaling          make scaling  reports/scaling.json, scaling.md
    python -m tools.bench.scaling_tables   docs/performance.md's scaling past one machine
    python -m tools.bench.plot             make plot     a PNG of runs' accuracy and loss

make bench's parts: in_process (plain TF, the input pipeline, start-up seconds),
training_paths, input_modes, versus_example, levers and versus_torch (against PyTorch
DDP: torch_ddp.py under torchrun, in the venv torch_venv.py makes, reading the data
through mnist_numpy.py). Under horovodrun, started by those: horovod_example (Horovod's
own MNIST example, the yardstick), step_levers and allreduce_probe. What they share:
launch (the horovodrun command line), training_run (one hvd_mnist run and its figures),
steady_state (images/s from a run's windows, medians over repeats), baselines (ratios of
a committed report), tables (rounding) and machine (the CPU a report names);
scaling_model (the step time of N workers, make scaling's fit at two) under scaling and
scaling_tables. step_profile runs step_profile_tf and step_profile_torch, one per
framework. Run by hand under horovodrun: request_probe (what preemption's requests add
to a step; docs/reliability.md).
"""
