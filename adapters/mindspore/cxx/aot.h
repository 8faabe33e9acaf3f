// The C++ side of polyop's MindSpore adapter: MindSpore's `AotExtra` (attributes of a Custom
// op) as its wheel declares it, the attribute readers Rust calls, and the four entry points
// every op exports (POLYOP_MS_OP, instantiated once per registry op by build.rs).
//
// Built with _GLIBCXX_USE_CXX11_ABI=0, the libstdc++ ABI of the MindSpore wheel: the infer
// functions pass std::string and std::vector across the boundary. The bridge's rust::Str and
// rust::Vec are converted here by hand, never through cxx's std::string helpers (compiled
// with the default ABI).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rust/cxx.h"

namespace mindspore {
// `mindspore/ccsrc/utils/custom_aot_extra.h` of the 2.10 wheel: only the virtual table
// matters (its order is the ABI); MindSpore keeps the getters private, callers here read them.
class AotExtra {
 public:
  virtual ~AotExtra() = default;
  virtual bool HasAttr(std::string name) = 0;
  virtual bool GetAttrBool(std::string name) = 0;
  virtual int64_t GetAttrInt(std::string name) = 0;
  virtual float GetAttrFloat(std::string name) = 0;
  virtual std::string GetAttrStr(std::string name) = 0;
  virtual std::vector<int64_t> GetAttrIntVec(std::string name) = 0;
  virtual std::vector<float> GetAttrFloatVec(std::string name) = 0;
};
}  // namespace mindspore

namespace polyopms {
using mindspore::AotExtra;

// Attribute readers for Rust (src/attrs.rs); MindSpore throws for a value of another type.
bool has_attr(AotExtra* e, rust::Str name);
bool attr_bool(AotExtra* e, rust::Str name);
int64_t attr_int(AotExtra* e, rust::Str name);
double attr_float(AotExtra* e, rust::Str name);
rust::String attr_str(AotExtra* e, rust::Str name);
rust::Vec<int64_t> attr_ints(AotExtra* e, rust::Str name);
rust::Vec<double> attr_floats(AotExtra* e, rust::Str name);

// The outputs' shapes from Rust's flat encoding (rank, dims..., per output).
std::vector<std::vector<int64_t>> shapes_of(const rust::Vec<int64_t>& flat);
}  // namespace polyopms

#include "polyop-mindspore/src/sys.rs.h"

// The exports of registry op `slot`, named NAME; MULTI: whether it has several outputs (then
// MindSpore asks for a shape and a type per output).
#define POLYOP_MS_ENTRY(SLOT, NAME)                                                        \
  extern "C" int NAME(int nparam, void** params, int* ndims, int64_t** shapes,             \
                      const char** dtypes, void* /*stream*/, void* extra) {                \
    polyopms::launch(SLOT, nparam, reinterpret_cast<uintptr_t>(params), ndims,            \
                      reinterpret_cast<uintptr_t>(shapes), reinterpret_cast<uintptr_t>(dtypes), \
                      static_cast<mindspore::AotExtra*>(extra));                             \
    return 0;                                                                              \
  }                                                                                        \
  extern "C" int NAME##Init(int*, int64_t**, const char**, mindspore::AotExtra*) { return 0; }
#define POLYOP_MS_OP1(SLOT, NAME)                                                          \
  POLYOP_MS_ENTRY(SLOT, NAME)                                                              \
  extern "C" std::vector<int64_t> NAME##InferShape(int* ndims, int64_t** shapes,           \
                                                   mindspore::AotExtra* e) {               \
    return polyopms::shapes_of(                                                           \
        polyopms::infer_shape(SLOT, ndims, reinterpret_cast<uintptr_t>(shapes), e))[0];   \
  }                                                                                        \
  extern "C" int NAME##InferType(std::vector<int> types, mindspore::AotExtra* e) {         \
    return polyopms::infer_type(SLOT, rust::Slice<const int>(types.data(), types.size()), e)[0]; \
  }
#define POLYOP_MS_OPN(SLOT, NAME)                                                          \
  POLYOP_MS_ENTRY(SLOT, NAME)                                                              \
  extern "C" std::vector<std::vector<int64_t>> NAME##InferShape(int* ndims, int64_t** shapes, \
                                                                mindspore::AotExtra* e) {  \
    return polyopms::shapes_of(                                                           \
        polyopms::infer_shape(SLOT, ndims, reinterpret_cast<uintptr_t>(shapes), e));      \
  }                                                                                        \
  extern "C" std::vector<int> NAME##InferType(std::vector<int> types, mindspore::AotExtra* e) { \
    auto t = polyopms::infer_type(SLOT, rust::Slice<const int>(types.data(), types.size()), e); \
    return std::vector<int>(t.begin(), t.end());                                           \
  }
