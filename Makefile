# The two commands the README promises: `make train` and `make test`. Each sets
# up whatever is missing first. NP is the number of Horovod workers.
NP ?= 4
PYTHON ?= python3.11
TF_FLAVOR ?= cpu
# TensorFlow minor version, pinned by tools/pins/tf$(TF).txt. The default lives
# in .venv; TF=2.18 (or 2.16, 2.17) builds and uses .venv-tf2.18 (BUILD_NOTES.md).
TF ?= 2.15
VENV := $(if $(filter 2.15,$(TF)),.venv,.venv-tf$(TF))
BIN := $(VENV)/bin
DATA_DIR ?= data/tfds
MODEL_DIR ?= runs/mnist
TRAIN_FLAGS ?=
# Test files or pytest flags for `make test` (default: the whole suite).
TESTS ?=
# A hang fails fast instead of eating the whole job's time.
export HOROVOD_STALL_CHECK_TIME_SECONDS ?= 60
export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS ?= 120

SETUP_STAMP := $(VENV)/.setup-done
DATA_STAMP := $(DATA_DIR)/mnist/3.0.1/dataset_info.json

.PHONY: setup data data-sharded train test parity bench clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): tools/setup.sh setup.cfg tools/pins/tf$(TF).txt
	PYTHON=$(PYTHON) TF_FLAVOR=$(TF_FLAVOR) TF=$(TF) VENV=$(CURDIR)/$(VENV) tools/setup.sh
	touch $@

data: $(DATA_STAMP)

$(DATA_STAMP): | $(SETUP_STAMP)
	$(BIN)/python -m hvd_mnist.prepare --data_dir=$(DATA_DIR)

# The same dataset written as 8 record files per split, for --input=files.
SHARDED_DATA_DIR ?= data/tfds-sharded
SHARDED_DATA_STAMP := $(SHARDED_DATA_DIR)/mnist/3.0.1/dataset_info.json
data-sharded: $(SHARDED_DATA_STAMP)

$(SHARDED_DATA_STAMP): | $(SETUP_STAMP)
	$(BIN)/python -m hvd_mnist.prepare --data_dir=$(SHARDED_DATA_DIR) --num_shards=8

train: $(SETUP_STAMP) $(DATA_STAMP)
	$(BIN)/horovodrun -np $(NP) -H localhost:$(NP) \
	  $(BIN)/python -m hvd_mnist.main --data_dir=$(DATA_DIR) --model_dir=$(MODEL_DIR) $(TRAIN_FLAGS)

test: $(SETUP_STAMP)
	$(BIN)/python -m pytest $(TESTS)

# Both training paths on the full data at -np 2, then reports/parity.md (~30 min).
parity: $(SETUP_STAMP) $(DATA_STAMP)
	$(BIN)/python tools/parity.py --np 2 --data_dir=$(DATA_DIR)

# Throughput, memory, start-up, time-to-99% and input modes side by side; reports/bench.json
# (~17 min).
bench: $(SETUP_STAMP) $(DATA_STAMP) $(SHARDED_DATA_STAMP)
	$(BIN)/python tools/bench.py --data_dir=$(DATA_DIR) --sharded_data_dir=$(SHARDED_DATA_DIR)

clean:
	rm -rf $(MODEL_DIR)
