// The Python module of nmt's C++ kernels (nmt/ops/native.py builds it). Every function runs
// without the interpreter lock: nmt's decoder workers (--inter-threads) run them at once.
#include <pybind11/stl.h>  // std::vector<torch::Tensor> from a list

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto unlocked = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("ancestor_attention", &ancestor_attention, unlocked);
  m.def("source_attention", &source_attention, unlocked);
  m.def("vocabulary_top", &vocabulary_top, unlocked);
  m.def("add_and_norm_", &add_and_norm_, unlocked);
  m.def("bias_relu_", &bias_relu_, unlocked);
}
