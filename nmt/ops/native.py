"""nmt's C++ kernels for fp32 CPU decoding (the sources in nmt/ops/csrc), built once per CPU.

A beam search step of a small model is many small operations; where PyTorch needs several
passes or a copy, these loops do the work in one (#30): the decoder self-attention over a cache
that is never reordered and the encoder-decoder attention (`nmt.ops.ancestor_attention`), and
the vocabulary's log-softmax and ranking (`nmt.ops.vocabulary_top`). Each is tested against the
PyTorch ops it replaces.

They are compiled with PyTorch's extension builder (a C++ compiler and ninja are needed) with
-march=native, into PyTorch's extensions folder ($TORCH_EXTENSIONS_DIR, else its cache folder)
under a name that carries the CPU, the sources, torch and Python: a folder shared between
machines never loads another CPU's build. `make install` builds them ahead (`python -m
nmt.ops.native`); otherwise the first fp32 model load does. Three rules keep this from hanging or
surprising (#66):
  - a finished build is imported straight from its file: nothing is written, so a read-only
    folder works, and torch's builder (and its CUDA_HOME warning) is not even imported;
  - a build runs in a private temporary folder under an `fcntl.flock` lock, which the OS
    releases when its holder dies (a SIGKILL, an OOM kill, a closed terminal), and is renamed
    into place only when complete; the next builder removes what a killed one left;
  - where there is no compiler or ninja, or the build failed before, one line says so and
    decoding keeps its PyTorch ops: the same maths, whose float rounding may differ in the last
    bits. NMT_NATIVE_KERNELS=0 chooses the PyTorch ops too (A/B runs, debugging).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

from nmt.ops.cpu_features import cpu_flags, cpuinfo_field

DISABLE_ENV = "NMT_NATIVE_KERNELS"
"""Set to 0 to decode with the PyTorch ops even where the C++ kernels build."""

SOURCES = ("vector_exp.h", "ancestor_attention.cpp", "vocabulary_top.cpp", "add_and_norm.cpp", "bindings.cpp")
"""nmt/ops/csrc, compiled as one unit (one compiler run: the build takes about 30 s)."""

CFLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp")

_lock = threading.Lock()
_built: dict[str, Any] = {}


def native_module() -> Optional[Any]:
    """The compiled kernels, loaded or built on the first call of a process, or None where they
    cannot be built or NMT_NATIVE_KERNELS=0; why not is said once on stderr."""
    if _disabled():
        return None
    with _lock:
        if "module" not in _built:
            _built["module"] = _load_or_build()
        return _built["module"]


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") == "0"


def loaded() -> Any:
    """The built module, for a decoding step: after the first build a dictionary lookup, not
    `native_module`'s lock and environment read on every layer of every step."""
    module = _built.get("module") or native_module()
    if module is None:
        raise RuntimeError("nmt's C++ decoder kernels are not built here (nmt.ops.native.native_module)")
    return module


def build_name() -> str:
    """The module's name: one per CPU, source text, flags, torch and Python (a valid identifier,
    since the compiled module's init function is named after it)."""
    import torch

    csrc = Path(__file__).parent / "csrc"
    key = hashlib.sha1()
    for part in (cpuinfo_field("model name"), " ".join(sorted(cpu_flags())), torch.__version__, sys.version,
                 *CFLAGS, *((csrc / f).read_text() for f in SOURCES)):
        key.update(part.encode() + b"\0")
    return f"nmt_native_{key.hexdigest()[:12]}"


def extensions_root() -> Path:
    """$TORCH_EXTENSIONS_DIR, else PyTorch's default extensions folder (without importing its
    builder)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    from torch import _appdirs

    return Path(os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions")))


def _import(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_or_build() -> Optional[Any]:
    import torch  # noqa: F401  (the module links against torch's libraries, loaded first)

    name = build_name()
    root = extensions_root()
    final = root / name / f"{name}.so"
    failed = root / f"{name}.failed"
    reason: Optional[str]
    if final.is_file():
        try:
            return _import(name, final)
        except ImportError as e:  # a build copied from another system (its libraries differ)
            reason = f"{final} does not load: {_reason(e)}; remove {final.parent} to build it again"
    else:
        try:
            reason = failed.read_text().strip() or "see an earlier run"
        except OSError:
            reason = _missing_tools()
    if reason is None:
        try:
            return _build(name, root, final)
        except Exception as e:  # a compiler error, missing headers, an unwritable folder
            reason = _reason(e)
            try:
                failed.write_text(reason + "\n")
                reason += f"; remove {failed} to try again"
            except OSError:
                pass
    elif failed.exists():
        reason += f"; remove {failed} to try again"
    print(f"nmt: the C++ decoder kernels cannot be built here ({reason}); decoding with the PyTorch ops instead: "
          f"slower, and their float rounding may differ in the last bits", file=sys.stderr)
    return None


def _missing_tools() -> Optional[str]:
    """Why torch's builder cannot run here, or None: asked before it runs, so that its own
    banners never reach the user."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on PATH"
    if shutil.which("ninja") is None:
        return "ninja is not on PATH (pip install ninja, or your system's ninja-build package)"
    return None


def _build(name: str, root: Path, final: Path) -> Any:
    """Build under a lock the OS releases when its holder dies, in a private folder renamed
    into place when complete."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("nmt: waiting for another process that is building the C++ decoder kernels", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_file():  # the process we waited for built them
            return _import(name, final)
        for leftover in root.glob(f".{name}.build-*"):  # we hold the lock: their builders are dead
            shutil.rmtree(leftover, ignore_errors=True)
        print("nmt: building the C++ decoder kernels for this CPU, once (about 30 s; cached in "
              f"{root})", file=sys.stderr)
        from torch.utils import cpp_extension

        staging = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=root))
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the build from the user's team
        csrc = Path(__file__).parent / "csrc"
        try:
            module = cpp_extension.load_inline(name, cpp_sources=[(csrc / f).read_text() for f in SOURCES],
                                               extra_include_paths=[str(csrc)], extra_cflags=list(CFLAGS),
                                               build_directory=str(staging), verbose=False)
            shutil.rmtree(final.parent, ignore_errors=True)  # a folder without its module: not a build
            os.rename(staging, final.parent)
            _fsync_directory(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return module


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reason(e: Exception) -> str:
    """The compiler's own complaint (missing, or an error) rather than ninja's last words."""
    lines = str(e).strip().splitlines() or [type(e).__name__]
    said = [line for key in ("not found", "error:", "No such file") for line in lines if key in line]
    return (said or lines[-1:])[0].strip()[:200]


if __name__ == "__main__":  # `make install`: build ahead, so that no command pays for it later
    if native_module() is not None:
        print(f"nmt: C++ decoder kernels ready in {extensions_root() / build_name()}", file=sys.stderr)
