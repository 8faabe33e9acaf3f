// The thin C++ layer of polyop's PyTorch adapter.
//
// The stable-ABI boxed calling convention is `void fn(StableIValue* stack, uint64_t num_args,
// uint64_t num_outputs)`: no user-data pointer, and errors must be reported by throwing a C++
// exception (torch turns std::runtime_error into Python's RuntimeError). Rust can do neither,
// so this file provides:
//   * a table of kSlots boxed functions `trampoline<Slot>`; slot i is handed to
//     torch_library_impl for the i-th op the Rust side registers (CPU and Meta share it);
//   * each trampoline calls the `extern "C"` Rust entry point, which never unwinds and returns
//     either nullptr or an error message; the trampoline then throws std::runtime_error.
// Everything else (registration, stack decoding, tensors, the thread pool) is Rust calling the
// C shim directly, through bindings bindgen generated from these headers (src/sys/bindings.rs,
// scripts/bindgen.conf with crates/polyop-build/scripts/regen-bindings.sh).

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace {

using BoxedFn = void (*)(StableIValue*, uint64_t, uint64_t);
// The Rust entry point (src/lib.rs `boxed_call`): returns nullptr on success, otherwise an
// error message owned by Rust that must be released with the FreeFn.
using CallFn = char* (*)(uint32_t, StableIValue*, uint64_t, uint64_t);
using FreeFn = void (*)(char*);

// Set by Rust (polyop_torch_set_entry) before any op is registered. Function pointers rather
// than exported symbols: torch loads extension libraries with RTLD_GLOBAL, so an exported
// entry point of the first polyop library loaded would interpose on every later one (an
// author's library next to the stock one). These symbols stay local to each library.
CallFn g_call = nullptr;
FreeFn g_free = nullptr;

[[noreturn]] void raise_owned(char* msg) {
  std::string text(msg);
  g_free(msg);
  throw std::runtime_error(text);
}

template <uint32_t Slot>
void trampoline(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  if (g_call == nullptr) {
    throw std::runtime_error("polyop: torch adapter entry point not set");
  }
  if (char* err = g_call(Slot, stack, num_args, num_outputs)) {
    raise_owned(err);
  }
}

template <uint32_t... I>
constexpr std::array<BoxedFn, sizeof...(I)> make_table(
    std::integer_sequence<uint32_t, I...> /*unused*/) {
  return {&trampoline<I>...};
}

constexpr uint32_t kSlots = 512;
constexpr std::array<BoxedFn, kSlots> kTable =
    make_table(std::make_integer_sequence<uint32_t, kSlots>{});

// The trampolines are handed to torch_library_impl (by Rust, as `polyop_torch_slot(i)`), so
// their type must be the boxed-kernel type the installed header declares.
static_assert(std::is_same_v<decltype(&torch_library_impl),
                             AOTITorchError (*)(TorchLibraryHandle, const char*, BoxedFn,
                                                uint64_t)>);

} // namespace

extern "C" {

void polyop_torch_set_entry(CallFn call, FreeFn free_error) {
  g_call = call;
  g_free = free_error;
}

uint32_t polyop_torch_num_slots() {
  return kSlots;
}

BoxedFn polyop_torch_slot(uint32_t i) {
  return i < kSlots ? kTable[i] : nullptr;
}

// The stable-ABI version these headers target (TORCH_FEATURE_VERSION), passed to
// torch_library_impl as the extension's build version.
uint64_t polyop_torch_build_version() {
  return TORCH_FEATURE_VERSION;
}

} // extern "C"
