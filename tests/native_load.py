"""`python tests/native_load.py`: load nmt's C++ decoder kernels as a command's first fp32 model load
does (building them where they are not built) and print whether they loaded and whether torch's
extension builder was imported (tests/test_native_build.py)."""

import sys

from nmt.ops.native import native_module

print("built" if native_module() is not None else "none", "torch.utils.cpp_extension" in sys.modules)
