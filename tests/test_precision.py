"""Mixed precision in this process: the model's dtypes in each precision, the export's
uint8-in, float32-out contract, the loss scale in a checkpoint, a resume in another
precision refused, and the one-line warning where bfloat16 would be emulated.
The multi-rank proofs (parity, invariance, a skipped overflow) are in
tests/test_precision_parity.py."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from conftest import synthetic_digits
from hvd_mnist import config as config_lib
from hvd_mnist.data import mnist, splits
from hvd_mnist.errors import UserFacingError
from hvd_mnist.outputs import checkpoint, export, run_identity
from hvd_mnist.training import model as model_lib, precision
from hvd_mnist.worker import keras_compat

PRECISIONS = config_lib.PRECISIONS
FLOAT32_VARIABLES = [name for name in PRECISIONS if name != "float64"]


@pytest.mark.parametrize("name", FLOAT32_VARIABLES)
def test_variables_softmax_and_output_stay_float32(name):
    model = model_lib.build_model(precision=name)
    assert {tf.as_dtype(v.dtype) for v in model.weights} == {tf.float32}
    compute = precision.COMPUTE_DTYPES[name]
    hidden = [layer.compute_dtype for layer in model.layers[:-1]]
    assert hidden == [compute] * len(hidden)
    assert model.layers[-1].compute_dtype == "float32"
    assert model(tf.zeros([2, *mnist.IMAGE_SHAPE])).dtype == tf.float32


def test_float64_builds_every_layer_and_variable_in_float64():
    model = model_lib.build_model(precision="float64")
    assert {tf.as_dtype(v.dtype) for v in model.weights} == {tf.float64}
    assert {layer.compute_dtype for layer in model.layers} == {"float64"}
    assert model(tf.zeros([2, *mnist.IMAGE_SHAPE], tf.float64)).dtype == tf.float64


@pytest.mark.parametrize("name", PRECISIONS)
def test_export_takes_uint8_and_returns_float32_in_every_precision(name, tmp_path):
    tf.keras.utils.set_random_seed(5)
    model = model_lib.build_model(precision=name)
    export.write(model, str(tmp_path / "export"), {"mode": "custom"})
    serve = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"]
    assert serve.structured_input_signature[1]["images"].dtype == tf.uint8
    images, _ = synthetic_digits(8, seed=2)
    served = serve(images=tf.constant(images))["probabilities"]
    assert served.dtype == tf.float32 and served.shape == (8, mnist.NUM_CLASSES)
    in_process = model(splits.normalize(images[..., np.newaxis], None)[0], training=False)
    # The same network in the same precision; the saved graph may fuse kernels differently.
    assert np.abs(served.numpy() - in_process.numpy()).max() <= 1e-2
    assert np.allclose(served.numpy().sum(axis=1), 1.0, atol=1e-5)


def store_for(model_dir, name):
    model = model_lib.build_model(precision=name)
    cfg = config_lib.TrainConfig(data_dir="", model_dir=str(model_dir), precision=name)
    batching = config_lib.resolve_batching(cfg, 1)
    optimizer = precision.with_loss_scaling(
        name, model_lib.make_optimizer(cfg.optimizer, batching.learning_rate))
    optimizer.build(model.trainable_variables)
    run = run_identity.of_run(cfg, batching, 1, 10, model, optimizer)
    return checkpoint.CheckpointStore(str(model_dir), model, optimizer, 3, run), model, optimizer


def test_a_checkpoint_keeps_the_loss_scale_and_rank_0_broadcasts_it(tmp_path):
    hvd.init()
    store, model, optimizer = store_for(tmp_path, "mixed_float16")
    assert precision.loss_scale(optimizer) == 2.0 ** 15  # Keras's default
    lowered = [v for v in keras_compat.state_variables(model, optimizer)
               if v.shape == () and v.dtype == tf.float32 and float(v) == 2.0 ** 15]
    assert len(lowered) == 1, "the loss scale is among the variables every rank takes"
    lowered[0].assign(1024.0)
    store.save(1)
    fresh_store, _, fresh = store_for(tmp_path, "mixed_float16")
    assert fresh_store.restore_latest().epoch == 1
    assert precision.loss_scale(fresh) == 1024.0


@pytest.mark.parametrize("saved,requested", [
    ("mixed_float16", "float32"), ("float32", "mixed_bfloat16"),
    ("mixed_bfloat16", "mixed_float16")])
def test_a_resume_in_another_precision_is_refused_in_one_line(tmp_path, saved, requested):
    store_for(tmp_path, saved)[0].save(1)
    with pytest.raises(UserFacingError) as error:
        store_for(tmp_path, requested)[0].restore_latest()
    assert str(error.value) == (
        f"cannot resume from {tmp_path}/checkpoints/ckpt-1: it belongs to another run "
        f"(--precision was {saved}, now {requested}); resume with --precision={saved}, or "
        "start afresh with another --model_dir")


def test_a_record_from_before_precision_existed_means_float32():
    record = run_identity.of_run(
        config_lib.TrainConfig(data_dir="", model_dir=""),
        config_lib.resolve_batching(config_lib.TrainConfig(data_dir="", model_dir=""), 1), 1,
        10, model_lib.build_model(), model_lib.make_optimizer("adadelta", 1.0))
    older = {k: v for k, v in record.items() if k != "precision"}
    assert run_identity.check_resume(older, record, "ckpt-1") == ""


def cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 {flags}"
                    "\n\nprocessor\t: 1\n")
    return str(path)


def test_bfloat16_without_bfloat16_instructions_warns_in_one_line(tmp_path):
    path = cpuinfo(tmp_path, "avx512f")
    assert precision.cpu_warning("mixed_bfloat16", False, path, isa_cap="") == (
        f"warning: this CPU has no bfloat16 instructions (neither avx512_bf16 nor amx_bf16 in "
        f"{path}): --precision=mixed_bfloat16 is emulated here, converting to and from "
        f"float32 around every operation; {precision.EMULATED_BFLOAT16_SPEED} "
        "(docs/precision.md)")


@pytest.mark.parametrize("cap", ["AVX2", "avx2", "AVX512_CORE"])
def test_bfloat16_with_onednn_capped_below_bfloat16_warns_whatever_the_cpu_has(tmp_path, cap):
    warning = precision.cpu_warning("mixed_bfloat16", False,
                                    cpuinfo(tmp_path, "avx512f avx512_bf16 amx_bf16"),
                                    isa_cap=cap)
    assert warning.startswith(f"warning: ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN from bfloat16 "
                              "instructions: --precision=mixed_bfloat16 is emulated here")


def test_the_cap_is_read_from_the_environment(tmp_path, monkeypatch):
    path = cpuinfo(tmp_path, "avx512f avx512_bf16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert precision.cpu_warning("mixed_bfloat16", False, path) != ""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert precision.cpu_warning("mixed_bfloat16", False, path) == ""


def test_bfloat16_capped_below_onednns_bfloat16_convolution_on_avx512_is_refused(tmp_path):
    environ = {"ONEDNN_MAX_CPU_ISA": "avx2"}
    with pytest.raises(UserFacingError, match=r"^--precision=mixed_bfloat16 cannot run with "
                       r"ONEDNN_MAX_CPU_ISA=AVX2 on this CPU: .* set TF_ENABLE_ONEDNN_OPTS=0"):
        precision.check_isa_cap("mixed_bfloat16", False, cpuinfo(tmp_path, "avx512f"), environ)


@pytest.mark.parametrize("precision_name,flags,has_gpu,environ", [
    ("mixed_bfloat16", "avx512f", False, {"ONEDNN_MAX_CPU_ISA": "AVX2",
                                          "TF_ENABLE_ONEDNN_OPTS": "0"}),  # Eigen computes it
    ("mixed_bfloat16", "", False, {"ONEDNN_MAX_CPU_ISA": "AVX2"}),  # an AVX2-only CPU: Eigen
    ("mixed_bfloat16", "avx512f", False, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),  # emulated
    ("mixed_bfloat16", "avx512f", True, {"ONEDNN_MAX_CPU_ISA": "AVX2"}),  # a GPU computes it
    ("float32", "avx512f", False, {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("mixed_bfloat16", "avx512f", False, {})])
def test_bfloat16_runs_under_every_other_cap(tmp_path, precision_name, flags, has_gpu, environ):
    precision.check_isa_cap(precision_name, has_gpu, cpuinfo(tmp_path, flags), environ)


@pytest.mark.parametrize("name,flags,has_gpu,cap", [
    ("mixed_bfloat16", "avx512f avx512_bf16", False, ""),  # AVX-512 with BF16 (this EPYC)
    ("mixed_bfloat16", "amx_bf16 amx_tile", False, ""),  # a Xeon with AMX
    ("mixed_bfloat16", "amx_bf16 amx_tile", False, "AVX512_CORE_AMX"),  # a cap above BF16
    ("mixed_bfloat16", "", True, "AVX2"),  # a GPU computes it
    ("float32", "", False, "AVX2"), ("mixed_float16", "", True, "")])
def test_no_warning_where_the_precision_runs_in_hardware(tmp_path, name, flags, has_gpu, cap):
    assert precision.cpu_warning(name, has_gpu, cpuinfo(tmp_path, flags), isa_cap=cap) == ""


@pytest.mark.parametrize("flags", ["avx2", "avx512f avx512_fp16 amx_bf16"])
def test_float16_on_any_cpu_warns_in_one_line(tmp_path, flags):
    assert precision.cpu_warning("mixed_float16", False, cpuinfo(tmp_path, flags)) == (
        "warning: no GPU is visible and TensorFlow's CPU kernels have no fast float16 path: "
        "--precision=mixed_float16 runs many times slower than --precision=float32 here "
        "(docs/precision.md)")


def test_no_warning_where_cpuinfo_says_nothing(tmp_path):
    assert precision.cpu_warning("mixed_bfloat16", False, str(tmp_path / "none"),
                                 isa_cap="") == ""


def test_the_start_line_says_what_crosses_the_network():
    def line(name, fp16_allreduce=False):
        return precision.describe(name, fp16_allreduce=fp16_allreduce)

    assert line("float32") == ""
    assert line("mixed_bfloat16").endswith(
        "gradients cross the network as float32")
    assert line("mixed_float16", fp16_allreduce=True).endswith(
        "gradients cross the network as float16, the loss scaled dynamically")
