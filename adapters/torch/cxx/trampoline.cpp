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
// C shim directly. The static_asserts below check that the hand-written Rust declarations in
// src/ffi.rs agree with the installed headers.

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

// --- the Rust declarations (src/ffi.rs) must match the headers -----------------------------
template <typename A, typename B>
constexpr bool same = std::is_same_v<A, B>;
using H = AtenTensorHandle;
static_assert(same<StableIValue, uint64_t>);
static_assert(same<AOTITorchError, int32_t>);
static_assert(same<decltype(&torch_library_impl),
                   AOTITorchError (*)(TorchLibraryHandle, const char*, BoxedFn, uint64_t)>);
static_assert(same<decltype(&aoti_torch_library_init_def),
                   AOTITorchError (*)(const char*, const char*, uint32_t, TorchLibraryHandle*)>);
static_assert(same<decltype(&aoti_torch_library_init_impl),
                   AOTITorchError (*)(const char*, const char*, const char*, uint32_t,
                                      TorchLibraryHandle*)>);
static_assert(same<decltype(&aoti_torch_library_init_fragment),
                   AOTITorchError (*)(const char*, const char*, uint32_t, TorchLibraryHandle*)>);
static_assert(same<decltype(&aoti_torch_library_def),
                   AOTITorchError (*)(TorchLibraryHandle, const char*)>);
static_assert(same<decltype(&torch_library_def_with_tags),
                   AOTITorchError (*)(TorchLibraryHandle, const char*, const int32_t*, int32_t)>);
static_assert(same<decltype(&aoti_torch_get_sizes), AOTITorchError (*)(H, int64_t**)>);
static_assert(same<decltype(&aoti_torch_get_strides), AOTITorchError (*)(H, int64_t**)>);
static_assert(same<decltype(&aoti_torch_get_dim), AOTITorchError (*)(H, int64_t*)>);
static_assert(same<decltype(&aoti_torch_get_dtype), AOTITorchError (*)(H, int32_t*)>);
static_assert(same<decltype(&aoti_torch_get_device_type), AOTITorchError (*)(H, int32_t*)>);
static_assert(same<decltype(&aoti_torch_get_device_index), AOTITorchError (*)(H, int32_t*)>);
static_assert(same<decltype(&aoti_torch_get_data_ptr), AOTITorchError (*)(H, void**)>);
static_assert(same<decltype(&aoti_torch_new_tensor_handle), AOTITorchError (*)(H, H*)>);
static_assert(same<decltype(&aoti_torch_delete_tensor_object), AOTITorchError (*)(H)>);
static_assert(same<decltype(&aoti_torch_copy_), AOTITorchError (*)(H, H, int32_t)>);
static_assert(same<decltype(&aoti_torch_empty_strided),
                   AOTITorchError (*)(int64_t, const int64_t*, const int64_t*, int32_t, int32_t,
                                      int32_t, H*)>);
static_assert(same<decltype(&torch_parallel_for),
                   AOTITorchError (*)(int64_t, int64_t, int64_t, ParallelFunc, void*)>);
static_assert(same<ParallelFunc, void (*)(int64_t, int64_t, void*)>);
static_assert(same<decltype(&torch_get_num_threads), AOTITorchError (*)(uint32_t*)>);
static_assert(same<decltype(&torch_string_length), AOTITorchError (*)(StringHandle, size_t*)>);
static_assert(same<decltype(&torch_string_c_str),
                   AOTITorchError (*)(StringHandle, const char**)>);
static_assert(same<decltype(&torch_delete_string), AOTITorchError (*)(StringHandle)>);
static_assert(same<decltype(&torch_list_size), AOTITorchError (*)(StableListHandle, size_t*)>);
static_assert(same<decltype(&torch_list_get_item),
                   AOTITorchError (*)(StableListHandle, size_t, StableIValue*)>);
static_assert(same<decltype(&torch_delete_list), AOTITorchError (*)(StableListHandle)>);
static_assert(same<decltype(&torch_delete_stable_ivalue), AOTITorchError (*)(StableIValue*)>);
static_assert(same<decltype(&torch_exception_get_what_without_backtrace), const char* (*)()>);

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
