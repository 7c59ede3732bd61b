"""Horovod v0.28.1 tests that fail on TF 2.21 + Keras 3 + NumPy 2 through their own use of
an API those removed, with the one change to each test that shows it (tools/horovod_suite.py
runs each again in a scratch copy with only that change, inside that test alone).

Each edit is (text in the test, what replaces it); a test's edits must all be found in its
own body, so an edit that stops matching the tag's file fails loudly instead of proving
nothing.
"""

import re
from typing import NamedTuple


class Case(NamedTuple):
    cause: str  # what the test itself uses that Keras 3 or NumPy 2 removed
    edits: tuple  # ((old, new), ...) inside the test's own function


MSE = ("keras.losses.mean_squared_error", "keras.losses.MeanSquaredError()")
LR = ("(lr=0.0001)", "(learning_rate=0.0001)")
NO_TF_FUNCTION_FLAG = ("experimental_run_tf_function=False", "")
NO_INPUT_LENGTH = (", input_length=10)", ")")
REF = (".ref()", ".path")
KERAS3_TEST_OPTIMIZER = (
    ("super().__init__(name=name, **kwargs)",
     "super().__init__(name=name, **{'learning_rate': 0.1, **kwargs})"),
    ("def update_step(self, gradient, variable):",
     "def update_step(self, gradient, variable, learning_rate=None):"),
)
AGGREGATE_FLAG = (",\n                    experimental_aggregate_gradients=False)", ")")

REMOVED_BY_KERAS3 = {
    "lr": "`lr=` (Keras 3 accepts only `learning_rate=`)",
    "mse": "`keras.losses.mean_squared_error` (not in Keras 3's tf.keras)",
    "compile": "`compile(experimental_run_tf_function=...)` and `Embedding(input_length=)` "
               "(Keras 3 rejects both)",
    "ref": "`variable.ref()` on Keras 3 variables (which have no `ref`; `.path` names them)",
    "optimizer": "a Keras 2 optimizer subclass: `Optimizer.__init__` without "
                 "`learning_rate` and `update_step(gradient, variable)`, which Keras 3 "
                 "requires and calls with a learning rate",
}

CASES: dict[str, dict[str, Case]] = {
    "test_tensorflow2_keras.py": {
        "test_train_model_lr_schedule": Case(
            f"{REMOVED_BY_KERAS3['mse']}; `ThresholdedReLU` and `optimizer.lr` (both removed "
            "in Keras 3); `compile(experimental_run_tf_function=...)`",
            (MSE, NO_TF_FUNCTION_FLAG, ("keras.layers.ThresholdedReLU(0.5)",
                                        "keras.layers.ReLU(threshold=0.5)"),
             ("self.model.optimizer.lr.numpy()", "self.model.optimizer.learning_rate.numpy()"))),
        "test_sparse_as_dense": Case(
            f"{REMOVED_BY_KERAS3['lr']}; {REMOVED_BY_KERAS3['mse']}; "
            f"{REMOVED_BY_KERAS3['compile']}",
            (LR, MSE, NO_TF_FUNCTION_FLAG, NO_INPUT_LENGTH)),
        "test_sparse_as_dense_with_grad_aggregation": Case(
            f"{REMOVED_BY_KERAS3['lr']}; {REMOVED_BY_KERAS3['mse']}; "
            f"{REMOVED_BY_KERAS3['compile']}",
            (LR, MSE, NO_TF_FUNCTION_FLAG, NO_INPUT_LENGTH)),
        "test_legacy_optimizer": Case(
            "`keras.optimizers.legacy` (Keras 3 has no legacy optimizers: using it raises "
            "ImportError, which the test's `hasattr` guard does not catch) and `lr=`; the "
            "scratch copy wraps Keras 3's Adam instead",
            (("keras.optimizers.legacy.Adam(lr=0.0001)",
              "keras.optimizers.Adam(learning_rate=0.0001)"), MSE, NO_TF_FUNCTION_FLAG,
             ("keras.layers.ThresholdedReLU(0.5)", "keras.layers.ReLU(threshold=0.5)"))),
        "test_gradient_aggregation": Case(
            f"{REMOVED_BY_KERAS3['optimizer']}; `apply_gradients("
            "experimental_aggregate_gradients=...)`, which Keras 3 does not take",
            KERAS3_TEST_OPTIMIZER + (AGGREGATE_FLAG,)),
        "test_gradient_aggregation_with_local_vars": Case(
            f"{REMOVED_BY_KERAS3['optimizer']}; `apply_gradients("
            "experimental_aggregate_gradients=...)`, which Keras 3 does not take",
            KERAS3_TEST_OPTIMIZER + (AGGREGATE_FLAG,)),
        "test_partial_distributed_optimizer": Case(REMOVED_BY_KERAS3["ref"], (REF,)),
        "test_broadcast_global_variables_callback_with_local_vars": Case(
            REMOVED_BY_KERAS3["ref"], (REF,)),
    },
    "test_tensorflow2_keras_process_sets.py": {
        "test_process_set_optimizer": Case(REMOVED_BY_KERAS3["optimizer"],
                                           KERAS3_TEST_OPTIMIZER),
    },
    "test_tensorflow.py": {
        "test_horovod_syncbn_cpu": Case(
            "`BatchNormalization(fused=False)` for its reference layer (Keras 3 has no "
            "`fused`), and `self.evaluate(layer.moving_mean)`: tf.test evaluates tensors, "
            "which a Keras 3 variable is not (its `.value` is)",
            (("tf.keras.layers.BatchNormalization(axis=1, fused=False)",
              "tf.keras.layers.BatchNormalization(axis=1)"),
             ("self.evaluate(sync_bn.moving_mean)", "self.evaluate(sync_bn.moving_mean.value)"),
             ("self.evaluate(bn.moving_mean)", "self.evaluate(bn.moving_mean.value)"),
             ("self.evaluate(sync_bn.moving_variance)",
              "self.evaluate(sync_bn.moving_variance.value)"),
             ("self.evaluate(bn.moving_variance)", "self.evaluate(bn.moving_variance.value)"))),
        "test_partial_distributed_gradient_tape": Case(REMOVED_BY_KERAS3["ref"], (REF,)),
    },
    "test_tensorflow_process_sets.py": {
        "test_horovod_reducescatter_grad_cpu_process_sets": Case(
            "NumPy 2's promotion rules (NEP 50): the float16 gradient's error is compared "
            "with `assertLess(err, 1e-8)`, and 1e-8 becomes float16 zero, so even an exact "
            "gradient fails `0 < 0`",
            (("self.assertLess(err, 0.00000001,", "self.assertLess(float(err), 0.00000001,"),)),
    },
}


# test/integration files whose tests fail through their training script's own use of a
# removed API: (the script, relative to the file's directory, the change), for every test
# of the file still failing.
SCRIPT_CASES: dict[str, tuple[str, Case]] = {
    "test_elastic_tensorflow2.py": ("data/elastic_tensorflow2_main.py", Case(
        "its training script data/elastic_tensorflow2_main.py resets the learning rate after "
        "every reset with `optimizer.lr.assign` (Keras 3 optimizers have only `learning_rate`)",
        (("optimizer.lr.assign(", "optimizer.learning_rate.assign("),))),
}


def apply_script_edits(source: str, case: Case) -> str:
    for old, new in case.edits:
        if source.count(old) != 1:
            raise ValueError(f"{old!r} is not in the script once")
        source = source.replace(old, new)
    return source


def function_span(source: str, name: str) -> tuple[int, int]:
    """The start and end offsets of method `name`'s body in a test class (4-space methods)."""
    found = re.search(rf"^    def {re.escape(name)}\(.*?$", source, re.M)
    if not found:
        raise ValueError(f"no method {name} in the test file")
    following = re.compile(r"^    (def |@)|^\S", re.M).search(source, found.end())
    return found.start(), following.start() if following else len(source)


def apply_edits(source: str, cases: dict[str, Case]) -> str:
    for name, case in cases.items():
        start, end = function_span(source, name)
        body = source[start:end]
        for old, new in case.edits:
            if old not in body:
                raise ValueError(f"{name}: {old!r} is not in the test")
            body = body.replace(old, new)
        source = source[:start] + body + source[end:]
    return source
