"""Lab notes live in one place, and what the prose names exists.

Measurements, run logs and per-machine tables belong in bench/RESULTS.md with their JSON files;
the code keeps one line of why and the path of the result file (docs/code.md, "Lab notes"). A
machine's name in the Python of nmt/, recipes/ or cli/ is the sign of a run log that crept back,
so it fails here; the result files' own names (`bench/results/DATE_COMMIT_MACHINE_...json`)
are the one place a machine is named there. The README stays a page a newcomer reads to the end.

And the names the docs, docstrings and comments (of nmt/, cli/, recipes/ and bench/) give a
reader resolve: every dotted `nmt.x.y` / `nmt.x.y.Name` / `nmt.x.y:Name`, every path and
`nmt/x/y.py:Name`, every `Class.attribute` of an nmt class in backticks, and every relative link
of README.md, docs/*.md and bench/RESULTS.md (its file, and the heading an `#anchor` names). A
rename that leaves one behind fails here with the file that still says the old name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import tokenize
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

README_MAX_LINES = 220
README_MAX_LINE_CHARS = 200

MACHINE_NAMES = re.compile(
    r"\b(?:sapphire|emerald ?rapids|granite ?rapids|ice ?lake|sky ?lake|cascade ?lake|xeons?|zen ?\d*|epyc|ryzen|"
    r"threadripper|graviton\d*|h100|h200|h800|a100|v100|mi300x?)\b", re.IGNORECASE)
"""Machine names, CPU and GPU. CPU features used as code facts (avx512_bf16, amx) and the
vendors a code path checks (AMD, Intel) are not machine names."""

RESULT_FILE = re.compile(r"bench/results/\S+")
"""A result file's path names its machine by design: the one place a .py file may."""


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_machine_name_in_the_python_of_nmt_recipes_and_cli():
    found = []
    for path in python_files("nmt", "recipes", "cli"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in MACHINE_NAMES.finditer(RESULT_FILE.sub("", line)):
                found.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)!r} in {line.strip()[:100]}")
    assert not found, ("measurements belong in bench/RESULTS.md with their result file; keep one line "
                       "of why and the file's path (docs/code.md, 'Lab notes'):\n" + "\n".join(found))


def test_the_readme_stays_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/*.md "
        "and numbers to bench/RESULTS.md")


def test_no_readme_line_is_longer_than_200_characters():
    long = [f"README.md:{number}: {len(line)} characters" for number, line
            in enumerate(README.read_text(encoding="utf-8").splitlines(), 1) if len(line) > README_MAX_LINE_CHARS]
    assert not long, "\n".join(long)


# --- what the prose names resolves --------------------------------------------------------------

def docstrings_and_comments(path: Path) -> Iterator[str]:
    """Every string statement (module, class, function and attribute docstrings) and comment."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.string


def prose() -> Iterator[tuple[str, str]]:
    """(where, text) of the docstrings and comments of nmt/, cli/, recipes/ and bench/, and of
    README.md and docs/*.md."""
    for path in python_files("nmt", "cli", "recipes", "bench"):
        for text in docstrings_and_comments(path):
            yield str(path.relative_to(REPO)), text
    for path in (README, *DOCS):
        yield str(path.relative_to(REPO)), path.read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def assigned_on_self(cls: type) -> frozenset[str]:
    """Attributes a class's methods set on `self` (instance attributes hasattr cannot see)."""
    try:
        tree = ast.parse(inspect.getsource(cls).lstrip())
    except (OSError, TypeError, SyntaxError, IndentationError):
        return frozenset()
    return frozenset(node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name) and node.value.id == "self"
                     and isinstance(node.ctx, ast.Store))


def has_attribute(obj: object, name: str) -> bool:
    if hasattr(obj, name):
        return True
    if isinstance(obj, type):
        return any(name in getattr(c, "__annotations__", {}) or name in assigned_on_self(c) for c in obj.__mro__)
    return False


def missing_attribute(obj: object, names: list[str]) -> Optional[str]:
    """The first of `names`, looked up one in the other, that `obj` lacks; None when all are there."""
    for i, name in enumerate(names):
        if not has_attribute(obj, name):
            return ".".join(names[: i + 1])
        obj = getattr(obj, name, None)
        if obj is None:  # an annotated or instance attribute: nothing further to look into
            return None
    return None


def unresolved_dotted(dotted: str, attributes: list[str]) -> Optional[str]:
    """Why `dotted` (nmt.x.y or nmt.x.y.Name...) with `attributes` (after a ':') does not resolve."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and not module_name.startswith(error.name) and error.name.startswith("nmt"):
                return f"importing {module_name} fails: {error}"
            continue
        missing = missing_attribute(module, parts[i:] + attributes)
        return None if missing is None else f"{module_name} has no {missing}"
    return "no such module"


DOTTED = re.compile(r"(?<![\w./-])(nmt(?:\.[A-Za-z_]\w*)+)(?::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?")
FILE_SUFFIXES = (".py", ".md", ".json", ".cpp", ".txt", ".jsonl", ".png", ".log", ".pt")


def test_every_dotted_nmt_name_in_docstrings_and_docs_resolves():
    unresolved = set()
    for where, text in prose():
        for match in DOTTED.finditer(text):
            dotted, attributes = match.group(1), match.group(2)
            if dotted.endswith(FILE_SUFFIXES):
                continue
            why = unresolved_dotted(dotted, attributes.split(".") if attributes else [])
            if why:
                unresolved.add(f"{where}: {match.group(0)}: {why}")
    assert not unresolved, "\n".join(sorted(unresolved))


PATH = re.compile(r"(?<![\w./-])((?:nmt|cli|recipes|bench|tests|docs)/[\w/.-]*[\w/])"
                  r"(?::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?")
PLACEHOLDER = re.compile(r"[A-Z]{2,}")
"""A path spelled with a placeholder (bench/results/DATE_COMMIT_MACHINE_bench-NAME.json) names no one file."""


def defined_in(path: Path, names: list[str]) -> Optional[str]:
    """For a file outside nmt/ (not imported here): whether its top level, or a class there,
    defines `names`; returns the first missing name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scope: list[ast.stmt] = tree.body
    for i, name in enumerate(names):
        found = None
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found = node
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                found = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name
                                                                         for a in node.names):
                found = node
        if found is None:
            return ".".join(names[: i + 1])
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return None


NAMES_AFTER = re.compile(r"`((?:, `[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*`)+)")
"""The names listed right after a `path.py:Name` span, each in the same file: in
`nmt/average.py:average_checkpoints`, `last_checkpoint_infos` the second is average.py's too."""


def unresolved_in_file(relative: str, names: list[str]) -> Optional[str]:
    path = REPO / relative
    if relative.startswith("nmt/"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        return unresolved_dotted(module.removesuffix(".__init__"), names)
    absent = defined_in(path, names)
    return absent and f"no {absent} there"


def test_every_path_and_name_in_the_prose_exists():
    """`nmt/model/transformer.py:Residual`, `tests/test_layout.py`, `bench/bench_train.py`: the file
    (or folder) exists, and a `:Name` after a .py file (and each name listed right after it) is
    defined there."""
    missing = set()
    for where, text in prose():
        for match in PATH.finditer(text):
            relative, attributes = match.group(1).rstrip("/"), match.group(2)
            if PLACEHOLDER.search(relative):
                continue
            path = REPO / relative
            if not path.exists():
                missing.add(f"{where}: {relative}: no such file")
                continue
            if not attributes or path.suffix != ".py":
                continue
            listed = NAMES_AFTER.match(text, match.end())
            more = re.findall(r"`([^`]+)`", listed.group(1)) if listed else []
            for names in (attributes, *more):
                why = unresolved_in_file(relative, names.split("."))
                if why:
                    missing.add(f"{where}: {relative}:{names}: {why}")
    assert not missing, "\n".join(sorted(missing))


@lru_cache(maxsize=None)
def nmt_classes() -> dict[str, list[str]]:
    """Class name -> the nmt modules that define a top-level class of that name."""
    classes: dict[str, list[str]] = {}
    for path in python_files("nmt"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(module)
    return classes


BACKTICKED = re.compile(r"`([^`\n]+)`")
CLASS_ATTRIBUTE = re.compile(r"(?<![\w./:])([A-Z][A-Za-z0-9]*)\.([A-Za-z_]\w*)\b")


def test_every_attribute_of_an_nmt_class_in_backticks_exists():
    """`Transformer.decode_step_hidden`, `SelfAttentionCache.reorder`: some nmt class of that
    name has the attribute (a method, a field, a class attribute or one its methods set)."""
    missing = set()
    for where, text in prose():
        for span in BACKTICKED.finditer(text):
            for match in CLASS_ATTRIBUTE.finditer(span.group(1)):
                name, attribute = match.groups()
                modules = nmt_classes().get(name)
                if not modules:
                    continue
                if not any(has_attribute(getattr(importlib.import_module(m), name), attribute) for m in modules):
                    missing.add(f"{where}: {match.group(0)}: no {name} in {', '.join(modules)} has {attribute}")
    assert not missing, "\n".join(sorted(missing))


LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (outside code blocks)."""
    anchors, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_relative_link_in_the_docs_points_at_a_file_and_a_heading():
    broken = []
    for page in (README, *DOCS, REPO / "bench" / "RESULTS.md"):
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not path.exists():
                broken.append(f"{where}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
                broken.append(f"{where}: no heading #{anchor} in {path.relative_to(REPO)}")
    assert not broken, "\n".join(broken)
