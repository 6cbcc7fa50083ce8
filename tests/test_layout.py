"""The package's shape: no import cycles, imports between packages only downwards, the model
without the data pipeline, every subpackage installed.

The import graph is read from the source (every `import` and `from ... import`, inside
functions too: a lazy import that closes a cycle is still a cycle a reader has to untangle).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NMT = REPO / "nmt"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in NMT.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The nmt modules that `name` imports anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("nmt"):
            found |= {node.module} & MODULES.keys()
            found |= {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & MODULES.keys()
    return found - {name}


GRAPH = {name: imports_of(name) for name in MODULES}


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in GRAPH[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def test_no_module_of_nmt_imports_itself_through_others():
    cycles = sorted(name for name in MODULES if name in reachable(name))
    assert cycles == [], f"modules on an import cycle: {cycles}"


LAYERS = (
    ("nmt_cli", "nmt"),
    ("serve",),
    ("api",),
    ("train", "distill"),
    ("inference",),
    ("export", "pretrained", "average", "score"),
    ("preprocess",),
    ("run",),
    ("data", "device"),
    ("ops",),
    ("model",),
    ("settings", "os_errors"),
    ("errors",),
)
"""nmt's subpackages and top-level modules, top down (`test_imports_between_packages_only_go_down`)."""
LAYER = {package: depth for depth, layer in enumerate(LAYERS) for package in layer}
SOURCES = {**MODULES, **{"nmt_cli." + module_name(p).removeprefix("cli."): p for p in (REPO / "cli").rglob("*.py")}}
"""nmt's modules and the command line's (the cli/ folder installs as nmt_cli)."""


def package_of(module: str) -> str:
    """nmt.train.loop -> train, nmt.errors -> errors, nmt (its __init__: `nmt.load`) -> nmt, nmt_cli.main -> nmt_cli."""
    top, *rest = module.split(".")
    return rest[0] if top == "nmt" and rest else top


def imported_modules(path: Path) -> set[str]:
    """The nmt and nmt_cli modules the file at `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: a relative import (nmt imports by absolute names)"
            # `from nmt import errors` imports the module nmt.errors; `from nmt import load`, nmt's __init__
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in SOURCES else node.module for a in node.names}
    return {m for m in found if m.split(".")[0] in ("nmt", "nmt_cli")}


def test_imports_between_packages_only_go_down():
    """Each package imports only from the layers below its own (LAYERS), never from its own layer
    or above, wherever the import sits. The layering this encodes, top down:

        nmt_cli, nmt         the commands; `nmt.load` (nmt/__init__.py)
        serve                the HTTP app over the Python API; it reads the train record's
                             architecture with nmt.train.config
        api                  `nmt.load`'s Model, over inference
        train                the loop over the engine; validation BLEU translates with inference
        inference            translation: its settings, the model with the device's ops, the searches,
                             and the CTranslate2 engine, which runs (and makes) exports
        export, pretrained,  one command each over the run directory and the stock model; export
        average, score       never imports inference (the checkpoint choice and the stock model
                             it needs live in run)
        preprocess           text to a run directory; export and import reuse its language-code
                             rule and Marian file names
        run                  the run directory: checkpoints, the TrainState they hold, which one
                             translates (checkpoint_choice), the stock model one holds
        data, device         tokens, tokenizers and batches; the device and number type
        ops                  the model's maths, faster on one device: subclasses of the model's
                             classes, so above the model; data pads batch lengths with its
                             `padded_length`, device reads its CPU features
        model                the paper: configuration and the stock Transformer
        settings, os_errors  settings fields and their ranges; the wording of OS errors
        errors               the one user-error type
    """
    unplaced = sorted({package_of(m) for m in SOURCES} - LAYER.keys())
    assert unplaced == [], f"give {unplaced} a place in LAYERS"
    back_edges = sorted(f"{module} imports {target}" for module, path in SOURCES.items() for target in imported_modules(path)
                        if package_of(target) != package_of(module) and LAYER[package_of(target)] <= LAYER[package_of(module)])
    assert back_edges == [], "imports against LAYERS (sideways or upwards)"


@pytest.mark.parametrize("package, allowed", [
    ("nmt.model", ("nmt.model", "nmt.errors", "nmt.settings")),
    ("nmt.ops", ("nmt.ops", "nmt.model", "nmt.errors", "nmt.settings")),
    # the run's vocabulary identity hashes the pieces its tokenizer reads; a checkpoint holds a stock model
    ("nmt.run", ("nmt.run", "nmt.errors", "nmt.settings", "nmt.model", "nmt.data.tokenizer")),
])
def test_lower_layers_import_nothing_above_them(package, allowed):
    """The model is importable without the data pipeline; the device ops without training."""
    used = set().union(*(reachable(m) for m in MODULES if m == package or m.startswith(package + ".")))
    above = sorted(m for m in used if not any(m == a or m.startswith(a + ".") for a in allowed))
    assert above == [], f"{package} reaches {above}"


def test_importing_the_model_loads_no_data_pipeline():
    code = ("import sys, nmt.model.transformer; "
            "print(sorted(m for m in sys.modules if m.startswith(('nmt.data', 'nmt.train', 'nmt.inference', 'nmt.preprocess'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_pyproject_installs_every_subpackage():
    packages = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    on_disk = {module_name(p) for p in NMT.rglob("__init__.py")}
    assert on_disk - set(packages) == set(), "add the new package(s) to [tool.setuptools] packages"


def test_the_model_has_no_device_specific_code_path():
    """Device branches live in nmt.ops (`optimize_for` picks them), never in the paper's model."""
    for path in (NMT / "model").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        for needle in ('"cpu"', '"cuda"', "is_compiling", "from nmt.ops"):
            assert needle not in source, f"{path.name} mentions {needle}"
