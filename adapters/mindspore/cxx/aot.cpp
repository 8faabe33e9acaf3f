// Attribute readers over MindSpore's AotExtra and the shape decoding of the infer exports
// (see aot.h). MindSpore's getters throw (a std::exception) for a missing attribute or one of
// another type; the bridge turns that into a Rust Err.
#include "polyop-mindspore/cxx/aot.h"

namespace polyopms {
namespace {
std::string str(rust::Str s) { return std::string(s.data(), s.size()); }
}  // namespace

bool has_attr(AotExtra* e, rust::Str name) { return e != nullptr && e->HasAttr(str(name)); }
bool attr_bool(AotExtra* e, rust::Str name) { return e->GetAttrBool(str(name)); }
int64_t attr_int(AotExtra* e, rust::Str name) { return e->GetAttrInt(str(name)); }
double attr_float(AotExtra* e, rust::Str name) { return e->GetAttrFloat(str(name)); }

rust::String attr_str(AotExtra* e, rust::Str name) {
  const std::string s = e->GetAttrStr(str(name));
  return rust::String::lossy(s.data(), s.size());
}

rust::Vec<int64_t> attr_ints(AotExtra* e, rust::Str name) {
  rust::Vec<int64_t> out;
  for (int64_t v : e->GetAttrIntVec(str(name))) out.push_back(v);
  return out;
}

rust::Vec<double> attr_floats(AotExtra* e, rust::Str name) {
  rust::Vec<double> out;
  for (float v : e->GetAttrFloatVec(str(name))) out.push_back(v);
  return out;
}

std::vector<std::vector<int64_t>> shapes_of(const rust::Vec<int64_t>& flat) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < flat.size(); i += 1 + static_cast<size_t>(flat[i])) {
    out.emplace_back(flat.begin() + i + 1, flat.begin() + i + 1 + flat[i]);
  }
  return out;
}
}  // namespace polyopms
