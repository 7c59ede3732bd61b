# The two commands the README promises: `make train` and `make test`. Each sets
# up whatever is missing first. NP is the number of Horovod workers.
NP ?= 4
# Empty: the first Python of the pins file's "# pythons:" line, found on PATH or in pyenv.
PYTHON ?=
TF_FLAVOR ?= cpu
# TensorFlow minor version, pinned by tools/pins/tf$(TF).txt. The default (2.21, Keras 3)
# lives in .venv; TF=2.15 (or 2.16-2.19) builds and uses .venv-tf2.15 (BUILD_NOTES.md).
TF ?= 2.21
# TF_FLAVOR=gpu (tensorflow[and-cuda], Horovod with NCCL) lives in .venv-gpu.
VENV := $(if $(filter 2.21,$(TF)),.venv,.venv-tf$(TF))$(if $(filter gpu,$(TF_FLAVOR)),-gpu)
BIN := $(VENV)/bin
DATA_DIR ?= data/tfds
MODEL_DIR ?= runs/mnist
TRAIN_FLAGS ?=
# MPI=1: `make setup` also installs Open MPI (Debian, as root) and builds Horovod with it.
MPI ?= 0
# Test files or pytest flags for `make test` (default: the whole suite).
TESTS ?=
# A hang fails fast instead of eating the whole job's time.
export HOROVOD_STALL_CHECK_TIME_SECONDS ?= 60
export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS ?= 120
# No TensorFlow INFO lines: horovodrun's own build check imports TensorFlow too (the
# workers set this themselves). TF_CPP_MIN_LOG_LEVEL=0 make train shows them again.
export TF_CPP_MIN_LOG_LEVEL ?= 1
# Where Horovod is built with MPI, horovodrun launches through Open MPI, whose ranks
# busy-poll while they wait: with more ranks than cores (make train: 4 on 2) that halved
# training (1102 against 2160 images/s at -np 4 here). Yielding when idle costs nothing.
export OMPI_MCA_mpi_yield_when_idle ?= 1

SETUP_STAMP := $(VENV)/.setup-done
TORCH_VENV := .venv-torch
TORCH_STAMP := $(TORCH_VENV)/.setup-done
# prepare writes the decoded copy (hvd_mnist/data/decoded.py) last.
DATA_STAMP := $(DATA_DIR)/hvd_mnist_decoded/mnist-3.0.1/source.json

# make plot: test accuracy and loss per epoch of these runs (summary.json or a parity report).
PLOT_RUNS ?= $(MODEL_DIR)/summary.json
PLOT ?= $(MODEL_DIR)/plot.png

.PHONY: setup data data-sharded train test test-long test-hosts test-avx2-arithmetic \
	test-repeat test-fresh parity bench bench-torch torch-venv step-profile bench-elastic plot \
	scaling horovod-suite \
	horovod-examples clean wheel test-gpu-build

setup: $(SETUP_STAMP)
ifeq ($(MPI),1)
	MPI=1 PYTHON=$(PYTHON) TF_FLAVOR=$(TF_FLAVOR) TF=$(TF) VENV=$(CURDIR)/$(VENV) tools/setup.sh
endif

# A changed patch changes the Horovod wheel's version, so setup.sh rebuilds it (only then).
$(SETUP_STAMP): tools/setup.sh tools/setup_python.sh tools/build_horovod.sh setup.cfg \
  tools/pins/tf$(TF).txt $(wildcard tools/pins/tf$(TF)-$(TF_FLAVOR).txt) \
  $(wildcard tools/horovod-patches/*.patch)
	MPI=$(MPI) PYTHON=$(PYTHON) TF_FLAVOR=$(TF_FLAVOR) TF=$(TF) VENV=$(CURDIR)/$(VENV) tools/setup.sh
	touch $@

# Always runs prepare: it checks what is there against the sizes and sha256s it recorded
# and writes again only what is missing or damaged, which leaves no newer file to see.
data: | $(SETUP_STAMP)
	$(BIN)/python -m hvd_mnist.prepare --data_dir=$(DATA_DIR)

# What the other targets need: record files newer than the decoded copy make it again.
$(DATA_STAMP): $(wildcard $(DATA_DIR)/mnist/3.0.1/*.tfrecord-*) | $(SETUP_STAMP)
	$(BIN)/python -m hvd_mnist.prepare --data_dir=$(DATA_DIR)

# The same dataset written as 8 record files per split, for --input=files.
SHARDED_DATA_DIR ?= data/tfds-sharded
SHARDED_DATA_STAMP := $(SHARDED_DATA_DIR)/hvd_mnist_decoded/mnist-3.0.1/source.json
data-sharded: | $(SETUP_STAMP)
	$(BIN)/python -m hvd_mnist.prepare --data_dir=$(SHARDED_DATA_DIR) --num_shards=8

$(SHARDED_DATA_STAMP): $(wildcard $(SHARDED_DATA_DIR)/mnist/3.0.1/*.tfrecord-*) | $(SETUP_STAMP)
	$(BIN)/python -m hvd_mnist.prepare --data_dir=$(SHARDED_DATA_DIR) --num_shards=8

# horovodrun hands its workers a pipe, so they cannot see a terminal themselves: a live
# bar when make's own output is a terminal, plain lines otherwise (CI, `| tee`, a log file).
train: $(SETUP_STAMP) $(DATA_STAMP)
	if [ -t 1 ]; then progress=bar; else progress=lines; fi; \
	$(BIN)/horovodrun -np $(NP) -H localhost:$(NP) \
	  $(BIN)/python -m hvd_mnist.main --data_dir=$(DATA_DIR) --model_dir=$(MODEL_DIR) \
	  --progress=$$progress $(TRAIN_FLAGS)

# Before a long run on several hosts: python -m hvd_mnist.verify over HOSTS (HOST:SLOTS,...;
# empty inside a Slurm allocation) checks that every host has the same stack, data and a
# writable model_dir and reaches the others, then that a few float64 steps across them end
# where one worker ends (docs/clusters.md). VERIFY_FLAGS: --ssh_port, --network_interface...
HOSTS ?=
VERIFY_FLAGS ?=
.PHONY: verify
verify: $(SETUP_STAMP) $(DATA_STAMP)
	$(BIN)/python -m hvd_mnist.verify --hosts=$(HOSTS) --data_dir=$(DATA_DIR) \
	  --model_dir=$(MODEL_DIR) $(VERIFY_FLAGS)

test: $(SETUP_STAMP)
	$(BIN)/python -m pytest -m "not hosts and not long" $(TESTS)

# The float64 and streamed-input parity runs (tests marked `long`): more horovodrun
# jobs than fit in `make test`'s budget (.ci/run runs them too).
test-long: $(SETUP_STAMP)
	$(BIN)/python -m pytest -m long

# The bfloat16 tests again in the AVX2-only machines' arithmetic, on a CPU with AVX-512
# (.ci/run runs it where /proc/cpuinfo lists avx512f; on an AVX2-only CPU make test has run
# them in it). There TensorFlow computes bfloat16 in its own (Eigen) kernels, since it hands
# bfloat16 to oneDNN only where the CPU has AVX-512: TF_ENABLE_ONEDNN_OPTS=0 does the same
# here, and the cap keeps whatever oneDNN still computes on its AVX2 kernels. Together they
# reproduced the AVX2-only EPYC's figures exactly, before and after hvd_mnist moved that
# kind's float32 operations to oneDNN (worker/cpu_kernels.py; docs/precision.md).
test-avx2-arithmetic: $(SETUP_STAMP)
	TF_ENABLE_ONEDNN_OPTS=0 ONEDNN_MAX_CPU_ISA=AVX2 $(BIN)/python -m pytest tests/test_precision_parity.py -k bfloat16

# The README's `make train NP=2 TRAIN_FLAGS=--recipe=fast` and a `make test` subset (parity,
# faults) from a clean clone of HEAD, in a chroot of a debootstrapped minimal Debian per
# suite in SUITES (tools/fresh_debian.sh; root; ~40 min per suite). build/fresh/<suite>.log;
# reports/fresh_machines.md.
SUITES ?= bookworm trixie
test-fresh:
	SUITES="$(SUITES)" tools/fresh_debian.sh

# The tests marked `hosts` on a test bed of network namespaces (tools/hosts.sh; root):
# two-host horovodrun (tests/test_hosts.py), verify (tests/test_verify.py) and Slurm batch
# jobs (tests/test_slurm.py, tools/slurm/bed.sh; `make setup MPI=1` installs Slurm); about
# 5 minutes (295 s on the AVX-512 EPYC, 318 s on the AVX2-only one, quiet: BUILD_NOTES.md, CI
# time): too long for `make test`.
test-hosts: $(SETUP_STAMP)
	$(BIN)/python -m pytest -v -m hosts

# The multi-rank error tests, REPEAT times over, counting each test's outcomes: a test
# that fails once in 20 is a failing test. REPEAT_TESTS chooses others.
REPEAT ?= 20
REPEAT_TESTS ?= tests/test_faults.py tests/test_horovodrun.py tests/test_preemption.py \
  -k "every_rank or stops_the_job or refused or disk_full or sigterm"
test-repeat: $(SETUP_STAMP)
	tools/repeat_tests.sh $(REPEAT) $(BIN)/python -m "not hosts" $(REPEAT_TESTS)

# Both training paths on the full data at -np 2 (two full trainings), then reports/parity.md.
parity: $(SETUP_STAMP) $(DATA_STAMP)
	$(BIN)/python -m tools.parity --np 2 --data_dir=$(DATA_DIR)

# Both training paths beside the step alone, time to 99%, hvd_mnist against Horovod's example
# and the same job in PyTorch DDP (in .venv-torch: torch-venv), each precision against the
# machine's peak and one step taken apart beside PyTorch's, side by side;
# reports/bench.json and .md (tools/bench/__main__.py). 37 min of bench on the AVX2-only
# EPYC (reports/bench_epyc_avx2.md: 2,220 s), 36 on the AMX Xeon (bench_xeon_amx.md: 2,150 s),
# 28 on the AVX-512 EPYC (bench.md: 1,679 s), not counting the making of the PyTorch venv.
bench: $(SETUP_STAMP) $(DATA_STAMP) $(TORCH_STAMP)
	$(BIN)/python -m tools.bench --data_dir=$(DATA_DIR)

# make bench's part "torch" alone: hvd_mnist against the same job in PyTorch DDP and Horovod's
# example at -np 1, 2 and 4, float32 and bfloat16; makes .venv-torch first when it is missing
# (torch-venv); writes bench_torch.json and .md into reports/. 28 min on the AVX2-only EPYC
# (reports/bench_torch_epyc_avx2.md), making the PyTorch venv included.
bench-torch: $(SETUP_STAMP) $(DATA_STAMP) $(TORCH_STAMP)
	$(BIN)/python -m tools.bench --parts=torch --data_dir=$(DATA_DIR)

# One training step taken apart, TensorFlow beside PyTorch, one thread, and the gradients'
# allreduce at -np 2 under Horovod and Gloo (tools/bench/step_profile.py); prints the tables
# and writes them, with every figure, to runs/bench/step_profile.md and .json.
step-profile: $(SETUP_STAMP) $(TORCH_STAMP)
	$(BIN)/python -m tools.bench.step_profile

# The PyTorch venv of make bench (tools/pins/torch.txt: PyTorch's CPU build and numpy, with
# the Python its "# pythons:" line allows). Its stamp is a copy of the pins it was made from:
# changed pins make it again from scratch, and an install cut short leaves no stamp.
torch-venv: $(TORCH_STAMP)
$(TORCH_STAMP): tools/pins/torch.txt
	rm -rf $(TORCH_VENV)
	PYTHON= PINS=$(CURDIR)/tools/pins/torch.txt FOR="PyTorch's pins" \
	  VENV=$(CURDIR)/$(TORCH_VENV) tools/setup_python.sh
	$(TORCH_VENV)/bin/python -m pip install --quiet -r tools/pins/torch.txt
	cp tools/pins/torch.txt $@

# --elastic without a failure beside a normal run at -np 2, taking turns, then the time
# from a worker's SIGKILL to the survivor's first commit; reports/elastic.md. 8 min on the
# AVX2-only EPYC (bdd133f's run).
bench-elastic: $(SETUP_STAMP) $(DATA_STAMP)
	$(BIN)/python -m tools.bench.elastic --data_dir=$(DATA_DIR)

plot: $(SETUP_STAMP)
	$(BIN)/python -m tools.plot --out=$(PLOT) $(PLOT_RUNS)

# 2 hosts x 1 worker over unlimited, 1 Gbit/s and 100 Mbit/s links, each lever;
# reports/scaling.md (needs root for the test bed; 519 s on the AVX-512 EPYC, its header).
scaling: $(SETUP_STAMP) $(DATA_STAMP)
	$(BIN)/python -m tools.bench.scaling --data_dir=$(DATA_DIR)

# Horovod's own tests (test/parallel of tag v0.28.1, from HOROVOD_SRC: an unpacked source
# tree of the tag, kept outside this repository) against the venv's Horovod, before and
# after tools/horovod-patches/, under Gloo and, where Horovod has it, MPI; each file with a
# timeout and the stall check. reports/horovod_suite.md (TF=2.15: _tf2.15.md;
# tools/horovod_suite.py). The tests
# want pytest<8, mock and parameterized: a venv of their own on top of $(VENV)'s packages,
# added as a site directory so that its .pth files apply too (setuptools' distutils shim,
# which horovod.runner needs on Python 3.12 for `distutils.spawn`).
HOROVOD_SRC ?=
SUITE_VENV := build/horovod-suite/$(VENV)
SUITE_REPORT := reports/horovod_suite$(if $(filter 2.21,$(TF)),,_tf$(TF)).md
# Refused before set-up, in make's one line, when HOROVOD_SRC is not such a tree.
ifneq ($(filter horovod-suite,$(MAKECMDGOALS)),)
ifeq ($(wildcard $(HOROVOD_SRC)/test/parallel/test_tensorflow.py),)
$(error make horovod-suite: HOROVOD_SRC=DIR must name an unpacked Horovod v0.28.1 source tree (with test/parallel/))
endif
endif
horovod-suite: $(SETUP_STAMP)
	test -x $(SUITE_VENV)/bin/python || { $(BIN)/python -m venv $(SUITE_VENV) && \
	  $(BIN)/python -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' \
	    >$$($(SUITE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/venv.pth && \
	  $(SUITE_VENV)/bin/pip install -q 'pytest<8' mock parameterized; }
	controllers=gloo; \
	if $(BIN)/horovodrun --check-build 2>/dev/null | grep -q '\[X\] MPI'; then controllers="gloo mpi"; fi; \
	$(SUITE_VENV)/bin/python tools/horovod_suite.py run --horovod_src=$(HOROVOD_SRC) \
	  --python=$(CURDIR)/$(SUITE_VENV)/bin/python --horovodrun=$(CURDIR)/$(BIN)/horovodrun \
	  --pins=tools/pins/tf$(TF).txt --controllers $$controllers \
	  --out=build/horovod-suite/tf$(TF) --report=$(SUITE_REPORT)

# Horovod's own TF2 MNIST examples (examples/ of the same HOROVOD_SRC tree), each at -np 2
# in a scratch copy that reads MNIST from data/cache/idx instead of downloading it, before
# and after the patches, under Gloo and, where Horovod has it, MPI (the elastic one: Gloo).
# reports/horovod_examples.md (tools/horovod_examples.py lists every edit and why).
ifneq ($(filter horovod-examples,$(MAKECMDGOALS)),)
ifeq ($(wildcard $(HOROVOD_SRC)/examples/tensorflow2/tensorflow2_mnist.py),)
$(error make horovod-examples: HOROVOD_SRC=DIR must name an unpacked Horovod v0.28.1 source tree (with examples/))
endif
endif
horovod-examples: $(SETUP_STAMP) $(DATA_STAMP)
	controllers=gloo; \
	if $(BIN)/horovodrun --check-build 2>/dev/null | grep -q '\[X\] MPI'; then controllers="gloo mpi"; fi; \
	$(BIN)/python tools/horovod_examples.py run --horovod_src=$(HOROVOD_SRC) \
	  --python=$(CURDIR)/$(BIN)/python --horovodrun=$(CURDIR)/$(BIN)/horovodrun \
	  --pins=tools/pins/tf$(TF).txt --idx_dir=$(CURDIR)/data/cache/idx --controllers $$controllers \
	  --out=build/horovod-examples/tf$(TF) \
	  --report=reports/horovod_examples$(if $(filter 2.21,$(TF)),,_tf$(TF)).md

# The patched Horovod as a wheel in dist/ for $(VENV)'s TensorFlow, flavour and MPI, to
# pip install into another TF environment instead of compiling (docs/horovod.md).
wheel: $(SETUP_STAMP)
	VENV=$(CURDIR)/$(VENV) TF=$(TF) TF_FLAVOR=$(TF_FLAVOR) tools/build_horovod.sh wheel

# The GPU build on this host, GPU or not: set up .venv-gpu, then NCCL built in, and the
# parity, fault and step tests on it (reports/build_log.md has the time; not in .ci/run).
GPU_BUILD_TESTS ?= tests/test_gpu_build.py tests/test_check_gpus.py tests/test_parity.py tests/test_faults.py \
  tests/test_train_step.py
test-gpu-build:
	$(MAKE) test TF_FLAVOR=gpu TESTS="$(GPU_BUILD_TESTS)"

clean:
	rm -rf $(MODEL_DIR)
