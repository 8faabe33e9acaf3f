// torch autograd for the ops of a polyop torch library called from Rust (polyop_tch).
//
// torch's stable C ABI cannot create autograd graph nodes, so this small file uses the libtorch
// C++ API that torch-sys already compiles against (same headers, same -D_GLIBCXX_USE_CXX11_ABI):
// it is tied to the torch version tch pins, unlike polyop's stable-ABI libraries.
//
// For each op, Rust passes the op's backward wiring from the library's metadata (nothing here
// names an op). `polyop_tch_register_autograd` registers a boxed kernel at the op's Autograd
// dispatch key. When an input requires grad (and grad mode is on) the kernel runs the op below
// autograd and attaches a `PolyopBackward` node to its float outputs; the node's `apply` calls
// the backward op the metadata names, with the grads / saved inputs / saved outputs it lists and
// the forward attributes of the same name, as polyop.torch's `register_autograd` glue does.
// Otherwise the kernel just redispatches. Every failure is a C++ exception (c10::Error), which
// the dispatcher or autograd engine turns into an error for the caller.

#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/node.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

enum class Kind : int32_t { Grad = 0, Input = 1, Output = 2 };

// One op's backward wiring (from the library's metadata), shared by its kernel and its nodes.
struct Wiring {
  std::string label;     // "polyop.gelu": the op as polyop's messages name it
  std::string bwd_name;  // "" when the op declares no backward op
  std::optional<c10::OperatorHandle> bwd;
  std::vector<std::pair<Kind, size_t>> bwd_inputs;  // the backward op's tensor arguments
  std::vector<size_t> bwd_outputs;                   // forward input of each backward result
};

bool is_tensor_arg(const c10::Argument& a) {
  const auto& t = a.real_type();
  if (t->kind() == c10::TypeKind::TensorType) return true;
  return t->kind() == c10::TypeKind::OptionalType &&
         t->containedType(0)->kind() == c10::TypeKind::TensorType;
}

struct PolyopBackward : public Node {
  std::shared_ptr<const Wiring> w;
  std::vector<bool> present;                    // forward tensor inputs given (not None)
  std::vector<SavedVariable> inputs, outputs;   // only those the backward op takes
  std::vector<std::pair<std::vector<int64_t>, at::TensorOptions>> out_meta;
  std::map<std::string, c10::IValue> attrs;     // forward attributes by name
  bool released = false;

  explicit PolyopBackward(std::shared_ptr<const Wiring> w_) : w(std::move(w_)) {}

  std::string name() const override { return "PolyopBackward(" + w->label + ")"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : inputs) s.reset_data();
    for (auto& s : outputs) s.reset_data();
    released = true;
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(w->bwd.has_value(), w->label,
                ": this op has no gradient (it declares no backward op)");
    TORCH_CHECK(!released, w->label,
                ": trying to backward through the graph a second time (its saved tensors were "
                "freed; use retain_graph=true the first time)");
    const auto& schema = w->bwd->schema();
    torch::jit::Stack stack;
    size_t k = 0;
    for (const auto& a : schema.arguments()) {
      if (!is_tensor_arg(a)) {
        auto it = attrs.find(a.name());
        TORCH_CHECK(it != attrs.end(), w->label, ": its backward op ", w->bwd_name,
                    " takes attribute '", a.name(), "', which the op does not have");
        stack.emplace_back(it->second);
        continue;
      }
      TORCH_CHECK(k < w->bwd_inputs.size(), w->label, ": the backward metadata lists ",
                  w->bwd_inputs.size(), " tensor arguments, ", w->bwd_name, " takes more");
      auto [kind, i] = w->bwd_inputs[k++];
      switch (kind) {
        case Kind::Grad:
          TORCH_CHECK(i < out_meta.size(), w->label, ": no output ", i);
          if (i < grads.size() && grads[i].defined()) {
            stack.emplace_back(grads[i]);
          } else {  // an output that got no gradient: zeros
            stack.emplace_back(at::zeros(out_meta[i].first, out_meta[i].second));
          }
          break;
        case Kind::Input:
          TORCH_CHECK(i < inputs.size(), w->label, ": no input ", i);
          if (present[i]) {
            stack.emplace_back(inputs[i].unpack());
          } else {
            stack.emplace_back(c10::IValue());
          }
          break;
        case Kind::Output:
          TORCH_CHECK(i < outputs.size(), w->label, ": no output ", i);
          stack.emplace_back(outputs[i].unpack(getptr()));
          break;
      }
    }
    w->bwd->callBoxed(stack);
    variable_list out(present.size());
    for (size_t j = 0; j < w->bwd_outputs.size() && j < stack.size(); ++j) {
      size_t i = w->bwd_outputs[j];
      // Drop the gradients of absent optional inputs (the kernel may still produce one).
      if (i < out.size() && present[i] && should_compute_output(i)) {
        out[i] = stack[j].toTensor();
      }
    }
    return out;
  }
};

// The boxed Autograd-key kernel of one op.
struct AutogradKernel : public c10::OperatorKernel {
  std::shared_ptr<Wiring> w;
  explicit AutogradKernel(std::shared_ptr<Wiring> w_) : w(std::move(w_)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                  torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const auto& args = schema.arguments();
    const size_t n_args = args.size(), n_ret = schema.returns().size();
    auto in = torch::jit::last(*stack, n_args);
    bool record = false;
    if (at::GradMode::is_enabled()) {
      for (size_t a = 0; a < n_args; ++a) {
        if (in[a].isTensor() && in[a].toTensor().requires_grad()) record = true;
      }
    }
    if (!record) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
      return;
    }
    auto node = c10::make_intrusive<PolyopBackward>(w);
    std::vector<at::Tensor> tensors;
    for (size_t a = 0; a < n_args; ++a) {
      if (is_tensor_arg(args[a])) {
        node->present.push_back(in[a].isTensor());
        tensors.push_back(in[a].isTensor() ? in[a].toTensor() : at::Tensor());
      } else {
        node->attrs.emplace(args[a].name(), in[a]);
      }
    }
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    auto outs = torch::jit::last(*stack, n_ret);
    torch::autograd::edge_list edges;
    for (const auto& t : tensors) {
      edges.push_back(t.defined() ? torch::autograd::impl::gradient_edge(t) : Edge());
    }
    node->set_next_edges(std::move(edges));
    std::vector<bool> need_in(tensors.size(), false), need_out(n_ret, false);
    for (auto [kind, i] : w->bwd_inputs) {
      if (kind == Kind::Input && i < need_in.size()) need_in[i] = true;
      if (kind == Kind::Output && i < need_out.size()) need_out[i] = true;
    }
    for (size_t r = 0; r < n_ret; ++r) {
      const at::Tensor& o = outs[r].toTensor();
      node->out_meta.emplace_back(o.sizes().vec(), o.options());
      if (torch::autograd::isDifferentiableType(o.scalar_type())) {
        torch::autograd::set_history(o, node);
      } else {  // topk's indices: no gradient, but keep the slots numbered like the outputs
        node->add_input_metadata(Node::undefined_input());
      }
    }
    node->inputs.resize(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (need_in[i] && tensors[i].defined()) node->inputs[i] = SavedVariable(tensors[i], false);
    }
    node->outputs.resize(n_ret);
    for (size_t r = 0; r < n_ret; ++r) {
      if (need_out[r]) {
        node->outputs[r] = SavedVariable(outs[r].toTensor(), /*is_output=*/true);
      }
    }
  }
};

std::mutex registry_mutex;
std::set<std::string>& registered() {
  static auto* s = new std::set<std::string>();
  return *s;
}
// The registrations, kept for the life of the process (destroying one would deregister its
// kernel, and static destructors may run after libtorch's own).
std::vector<torch::Library*>& libraries() {
  static auto* v = new std::vector<torch::Library*>();
  return *v;
}

void write_error(char* err, size_t len, const std::string& msg) {
  if (err == nullptr || len == 0) return;
  size_t n = std::min(len - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace

// Registers the Autograd kernel of `ns::name` (once per process). `bwd_name` is null for an op
// that declares no backward op (backward() through it then fails naming the op). The backward
// op's tensor arguments are `bwd_kinds[k]` (0 grad, 1 input, 2 output) number `bwd_index[k]`;
// its results are the gradients of forward inputs `bwd_outputs`. Returns 0, or 1 with a
// message in `err`.
extern "C" int polyop_tch_register_autograd(const char* ns, const char* label, const char* name,
                                            const char* bwd_name, const int32_t* bwd_kinds,
                                            const uint64_t* bwd_index, size_t n_bwd_inputs,
                                            const uint64_t* bwd_outputs, size_t n_bwd_outputs,
                                            char* err, size_t err_len) {
  try {
    std::lock_guard<std::mutex> lock(registry_mutex);
    std::string qualified = std::string(ns) + "::" + name;
    if (registered().count(qualified)) return 0;
    auto w = std::make_shared<Wiring>();
    w->label = std::string(label) + "." + name;
    c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), "");
    if (bwd_name != nullptr) {
      w->bwd_name = bwd_name;
      w->bwd = c10::Dispatcher::singleton().findSchemaOrThrow(
          (std::string(ns) + "::" + bwd_name).c_str(), "");
      for (size_t k = 0; k < n_bwd_inputs; ++k) {
        TORCH_CHECK(bwd_kinds[k] >= 0 && bwd_kinds[k] <= 2, "bad backward input kind");
        w->bwd_inputs.emplace_back(static_cast<Kind>(bwd_kinds[k]), bwd_index[k]);
      }
      w->bwd_outputs.assign(bwd_outputs, bwd_outputs + n_bwd_outputs);
    }
    auto* lib = new torch::Library(torch::Library::IMPL, ns, c10::DispatchKey::Autograd,
                                   __FILE__, __LINE__);
    libraries().push_back(lib);
    lib->impl(name, torch::CppFunction::makeFromBoxedFunctor(
                        std::make_unique<AutogradKernel>(std::move(w))));
    registered().insert(qualified);
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, e.what());
    return 1;
  } catch (...) {
    write_error(err, err_len, "unknown C++ exception");
    return 1;
  }
}
