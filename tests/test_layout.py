"""The package's shape: no import cycles, the model without the data pipeline, every subpackage installed.

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


@pytest.mark.parametrize("package, allowed", [
    ("nmt.model", ("nmt.model", "nmt.errors", "nmt.settings")),
    ("nmt.ops", ("nmt.ops", "nmt.model", "nmt.errors", "nmt.settings")),
    # the run's vocabulary identity hashes the pieces its tokenizer reads
    ("nmt.run", ("nmt.run", "nmt.errors", "nmt.settings", "nmt.model.config", "nmt.train.state", "nmt.data.tokenizer")),
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
