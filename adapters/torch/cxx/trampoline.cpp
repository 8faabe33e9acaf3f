// The thin C++ layer of polyop's PyTorch adapter.
//
// The stable-ABI boxed calling convention is `void fn(StableIValue* stack, uint64_t num_args,
// uint64_t num_outputs)`: no user-data pointer, and errors are reported by throwing a C++
// exception (torch turns it into Python's RuntimeError). So this file keeps a table of kSlots
// boxed functions `trampoline<Slot>`; slot i is the kernel of the i-th op the Rust side
// registers (CPU and Meta share it). Each calls the Rust entry point `boxed_call` through the
// cxx bridge (src/sys.rs), which throws `rust::Error` (a std::exception carrying polyop's
// message) when the Rust side returns an error. Everything else (registration, stack decoding,
// tensors, the thread pool) is Rust calling the C shim directly, through bindings bindgen
// generated from the same headers (src/sys/bindings.rs).

#include "polyop-torch/cxx/trampoline.h"

#include <array>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "polyop-torch/src/sys.rs.h"

namespace polyop_torch {
namespace {

using BoxedFn = void (*)(StableIValue*, uint64_t, uint64_t);

// StableIValue is the uint64_t the bridge passes.
static_assert(std::is_same_v<StableIValue, uint64_t>);

template <uint32_t Slot>
void trampoline(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  boxed_call(Slot, stack, num_args, num_outputs);
}

template <uint32_t... I>
constexpr std::array<BoxedFn, sizeof...(I)> make_table(
    std::integer_sequence<uint32_t, I...> /*unused*/) {
  return {&trampoline<I>...};
}

constexpr uint32_t kSlots = 512;
constexpr std::array<BoxedFn, kSlots> kTable =
    make_table(std::make_integer_sequence<uint32_t, kSlots>{});

// The trampolines are handed to torch_library_impl, so their type must be the boxed-kernel
// type the installed header declares.
static_assert(std::is_same_v<decltype(&torch_library_impl),
                             AOTITorchError (*)(TorchLibraryHandle, const char*, BoxedFn,
                                                uint64_t)>);

}  // namespace

uint32_t num_slots() { return kSlots; }

void impl_slot(TorchLibraryOpaque* lib, rust::Str name, uint32_t slot) {
  if (slot >= kSlots) {
    throw std::out_of_range("polyop: no trampoline slot " + std::to_string(slot));
  }
  const std::string n(name);
  // TORCH_FEATURE_VERSION: the stable-ABI version these headers target, passed as the
  // extension's build version.
  if (torch_library_impl(lib, n.c_str(), kTable[slot], TORCH_FEATURE_VERSION) !=
      AOTI_TORCH_SUCCESS) {
    const char* what = torch_exception_get_what_without_backtrace();
    throw std::runtime_error(what != nullptr ? what : "torch_library_impl failed");
  }
}

// The slot number of a probe call (src/sys.rs PROBE_SLOT), never a real slot.
void probe(uint64_t* token) { boxed_call(UINT32_MAX, token, 0, 0); }

}  // namespace polyop_torch
