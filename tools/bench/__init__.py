"""The benchmarks of the make targets, run from the repository root:

    python -m tools.bench                  make bench         reports/bench.json, bench.md
    python -m tools.bench --parts=torch    make bench-torch   bench_torch.json, .md in reports/
    python -m tools.bench.step_profile     make step-profile  one step, TF beside PyTorch
    python -m tools.bench.elastic          make bench-elastic reports/elastic.json, elastic.md
    python -m tools.bench.scaling          make scaling       reports/scaling.json, scaling.md

What they share: launch (running a job, and what the bench reads of it), steady_state
(images/s from a run's windows), tables (how a report is written) and machine (its CPU).
"""
