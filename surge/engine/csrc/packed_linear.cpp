// surge::packed_linear(x, packed, weight, bias): x W^T + b through oneDNN's packed copy of W
// (`mkldnn::_linear_pointwise`), registered from C++ so that a compiled decode graph's C++
// wrapper calls it through the dispatcher without Python. `weight` (the plain view) only
// gives the shape function its output width (surge.engine.gemv registers it). Why an op of
// our own: inductor lowers oneDNN's linear only for weights frozen into the graph, and
// surge's weights are graph inputs (views of block buffers, packed while serving). The same
// op written in Python cost 2.3% of a 32-row decode step (quiet profile, 100mb preset).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>

#include <optional>
#include <string_view>

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias) {
  (void)weight;
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(),
                 c10::string_view(""));
}

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("packed_linear(Tensor x, Tensor packed, Tensor weight, Tensor? bias) -> Tensor");
}
// Every backend key: the packed weight is an MkldnnCPU tensor, the input a CPU one.
TORCH_LIBRARY_IMPL(surge, CompositeExplicitAutograd, m) { m.impl("packed_linear", &packed_linear); }
