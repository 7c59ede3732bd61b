"""hvd_mnist/'s layers (docs/architecture.md): no module imports from a layer above its own.

Imports are read with `ast`, not run, so every import counts: at the top of a file,
inside a function, or only under a flag.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hvd_mnist"

# Lowest first. A module may import from its own layer and the layers before it.
# An entry is a top-level module (name.py) or a sub-package (name/) of hvd_mnist.
LAYERS = (
    ("errors", ("errors.py",)),
    # __init__.py makes tf-keras tf.keras before anything loads TensorFlow: worker set-up.
    ("worker", ("worker/", "__init__.py")),
    ("settings", ("config.py", "recipes.py")),
    ("data", ("data/",)),
    ("outputs", ("outputs/",)),
    ("training", ("training/",)),
    ("verification", ("verification/",)),
    ("commands", ("main.py", "train_flags.py", "prepare.py", "predict.py", "verify.py", "check_gpus.py")),
)

# Upward imports allowed for now, each named with its reason:
# ("hvd_mnist/<path>.py", "<imported module>"): "why".
EXCEPTIONS = {}


def layer_of(entry: str) -> str:
    for name, entries in LAYERS:
        if entry in entries:
            return name
    raise AssertionError(f"hvd_mnist/{entry} is in no layer: add it to LAYERS in "
                         f"tests/test_layers.py and to docs/architecture.md")


def entry_of(module: str, package: pathlib.Path) -> str:
    """The LAYERS entry of a dotted module inside hvd_mnist ("hvd_mnist.data.idx" -> "data/")."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    return f"{parts[0]}/" if (package / parts[0]).is_dir() else f"{parts[0]}.py"


def imported_modules(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The hvd_mnist modules one import statement names, relative imports resolved."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            anchor = here[:len(here) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        # `from hvd_mnist import data` names the sub-package, not the package.
        names = [f"{base}.{alias.name}" for alias in node.names] if base == "hvd_mnist" else [base]
    else:
        return []
    return [name for name in names if name == "hvd_mnist" or name.startswith("hvd_mnist.")]


def upward_imports(package: pathlib.Path) -> list[str]:
    """One line per import that reaches a higher layer and is not in EXCEPTIONS."""
    rank = {name: index for index, (name, _) in enumerate(LAYERS)}
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent)
        module = ".".join(relative.with_suffix("").parts)
        is_package = path.name == "__init__.py"
        if is_package:
            module = module.removesuffix(".__init__")
        source = layer_of(entry_of(module, package))
        nodes = sorted(ast.walk(ast.parse(path.read_text(), str(path))),
                       key=lambda node: getattr(node, "lineno", 0))
        for node in nodes:
            for target in imported_modules(node, module, is_package):
                destination = layer_of(entry_of(target, package))
                if (rank[destination] > rank[source]
                        and (relative.as_posix(), target) not in EXCEPTIONS):
                    found.append(f"{relative.as_posix()}:{node.lineno}: {source} -> {destination} "
                                 f"(imports {target})")
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    upward = upward_imports(PACKAGE)
    assert not upward, "upward imports (see LAYERS in tests/test_layers.py):\n" + "\n".join(upward)


def test_every_layer_entry_exists_and_every_module_has_a_layer():
    entries = [entry for _, layer in LAYERS for entry in layer]
    assert len(entries) == len(set(entries))
    for entry in entries:
        assert (PACKAGE / entry.rstrip("/")).exists(), f"hvd_mnist/{entry} in LAYERS does not exist"
    for path in PACKAGE.iterdir():
        if path.suffix == ".py" or (path / "__init__.py").exists():
            layer_of(f"{path.name}/" if path.is_dir() else path.name)


def test_every_exception_is_still_an_import():
    for (file, target), reason in EXCEPTIONS.items():
        tree = ast.parse((PACKAGE.parent / file).read_text())
        module = file.removesuffix(".py").replace("/", ".")
        named = {name for node in ast.walk(tree)
                 for name in imported_modules(node, module, file.endswith("__init__.py"))}
        assert target in named, f"EXCEPTIONS names {file} -> {target} ({reason}), which is gone"


def test_an_upward_import_is_found_with_its_file_line_and_layers(tmp_path):
    package = tmp_path / "hvd_mnist"
    for entry in ("worker/", "data/", "training/"):
        (package / entry).mkdir(parents=True)
        (package / entry / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from hvd_mnist.worker import runtime\n")
    (package / "training" / "model.py").write_text("from hvd_mnist.data import splits\n")
    (package / "data" / "inputs.py").write_text(
        "import os\n\n\ndef shape():\n    from hvd_mnist.training import model\n"
        "    from ..training.model import build\n    import hvd_mnist.training\n")
    assert upward_imports(package) == [
        "hvd_mnist/data/inputs.py:5: data -> training (imports hvd_mnist.training)",
        "hvd_mnist/data/inputs.py:6: data -> training (imports hvd_mnist.training.model)",
        "hvd_mnist/data/inputs.py:7: data -> training (imports hvd_mnist.training)",
    ]
