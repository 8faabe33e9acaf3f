// The thin C++ layer of polyop's PyTorch adapter, declared for the cxx bridge (src/sys.rs).
#pragma once

#include <torch/csrc/stable/c/shim.h>

#include <cstdint>

#include "rust/cxx.h"

namespace polyop_torch {

// How many ops one library can register (the size of the trampoline table).
uint32_t num_slots();

// Register trampoline `slot` as the boxed kernel of `name` in the impl library `lib`
// (torch_library_impl with this build's stable-ABI version). Throws on failure, with torch's
// message; cxx turns that into a Rust Err.
void impl_slot(TorchLibraryOpaque* lib, rust::Str name, uint32_t slot);

// Calls the Rust entry point through the same path a trampoline does, with the probe slot, so
// the Rust side can check that the entry point it reaches is its own library's.
void probe(uint64_t* token);

}  // namespace polyop_torch
