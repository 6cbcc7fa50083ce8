"""nmt's C++ kernels for fp32 CPU decoding (the sources in nmt/ops/csrc), built once per CPU.

A beam search step of a small model is many small operations; where PyTorch needs several
passes or a copy, these loops do the work in one (#30): the decoder self-attention over a cache
that is never reordered and the encoder-decoder attention (`nmt.ops.ancestor_attention`), and
the vocabulary's log-softmax and ranking (`nmt.ops.vocabulary_top`). Each is tested against the
PyTorch ops it replaces.

They are compiled on first use with PyTorch's extension builder (a C++ compiler and ninja are
needed) with -march=native, so the build is cached per CPU in PyTorch's extensions folder
(the name carries the CPU: a cache shared between machines never loads another CPU's build).
Where they cannot be built, fp32 decoding keeps its PyTorch ops and says so once on stderr:
the same maths, whose float rounding may differ in the last bits. NMT_NATIVE_KERNELS=0 chooses
the PyTorch ops too (A/B runs, debugging).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Optional

from nmt.ops.cpu_features import cpu_flags, cpuinfo_field

DISABLE_ENV = "NMT_NATIVE_KERNELS"
"""Set to 0 to decode with the PyTorch ops even where the C++ kernels build."""

SOURCES = ("vector_exp.h", "ancestor_attention.cpp", "vocabulary_top.cpp", "add_and_norm.cpp", "bindings.cpp")
"""nmt/ops/csrc, compiled as one unit (one compiler run: the build takes about 30 s). The header
comes first, so that its text is part of what PyTorch's build cache compares (the sources'
own #include of it then finds its guard defined)."""

_lock = threading.Lock()
_built: dict[str, Any] = {}


def native_module() -> Optional[Any]:
    """The compiled kernels, built on the first call of a process (cached across processes), or
    None where they cannot be built or NMT_NATIVE_KERNELS=0; a failed build says why once on stderr."""
    if _disabled():
        return None
    with _lock:
        if "module" not in _built:
            _built["module"] = _build()
        return _built["module"]


def ready() -> Optional[Any]:
    """The kernels if this process has built or loaded them already, else None: for code that
    may use them but must not start a build (a training run's validation search)."""
    return None if _disabled() else _built.get("module")


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") == "0"


def loaded() -> Any:
    """The built module, for a decoding step: after the first build a dictionary lookup, not
    `native_module`'s lock and environment read on every layer of every step."""
    module = _built.get("module") or native_module()
    if module is None:
        raise RuntimeError("nmt's C++ decoder kernels are not built here (nmt.ops.native.native_module)")
    return module


def _build() -> Optional[Any]:
    cpu = hashlib.sha1((cpuinfo_field("model name") + " ".join(sorted(cpu_flags()))).encode()).hexdigest()[:10]
    name = f"nmt_native_{cpu}"
    try:
        from torch.utils import cpp_extension

        csrc = Path(__file__).parent / "csrc"
        sources = [(csrc / f).read_text() for f in SOURCES]
        if not _already_built(cpp_extension, name):
            print("nmt: building the C++ decoder kernels for this CPU, once (about 30 s; cached in PyTorch's "
                  "extensions folder)", file=sys.stderr)
        return cpp_extension.load_inline(name, cpp_sources=sources, extra_include_paths=[str(csrc)], verbose=False,
                                         extra_cflags=["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"])
    except Exception as e:  # no compiler, no ninja, no headers: the PyTorch ops instead
        lines = str(e).strip().splitlines() or [type(e).__name__]
        # the compiler's own complaint (missing, or an error) rather than ninja's last words
        said = [line for key in ("not found", "error:", "No such file") for line in lines if key in line]
        reason = (said or lines[-1:])[0].strip()[:200]
        print(f"nmt: the C++ decoder kernels could not be built ({reason}); decoding with the PyTorch ops "
              f"instead: slower, and their float rounding may differ in the last bits", file=sys.stderr)
        return None


def _already_built(cpp_extension: Any, name: str) -> bool:
    """Whether a build of `name` is in PyTorch's extensions folder (a private helper of
    PyTorch's: where it is gone, the first build is not announced)."""
    try:
        return os.path.isfile(os.path.join(cpp_extension._get_build_directory(name, verbose=False), f"{name}.so"))
    except Exception:
        return True
