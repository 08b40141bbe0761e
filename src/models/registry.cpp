#include "model/architecture.h"

namespace kiln {
namespace {

constexpr Architecture kArchitectures[] = {
    {"llama", load_llama},
    {"mpt", load_mpt},
};

}  // namespace

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : kArchitectures)
    if (name == a.name) return &a;
  return nullptr;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture& a : kArchitectures) names.push_back(a.name);
  return names;
}

}  // namespace kiln
