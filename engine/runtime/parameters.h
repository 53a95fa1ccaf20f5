// The parameters of the layers a rank holds, with their gradients, in two flat buffers (one optimizer pass
// and, later, one bucketed gradient sync over contiguous memory). Parameters are laid out in ModelSpec order.
//
// What always holds: initialisation of a parameter depends only on (seed, parameter name, element index), so
// any placement of layers over ranks initialises the same model; gradients are zeroed by zeroGrads() only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "plan/model_spec.h"
#include "runtime/memory.h"

namespace ms {

struct Parameter {
  ParamSpec spec;
  size_t offset = 0;  // into the flat buffers
  size_t numel = 0;
};

class ParameterStore {
 public:
  // Lays out the parameters of the given layers of the spec.
  ParameterStore(const ModelSpec& spec, const std::vector<int>& layerIndices, MemoryTracker* tracker);

  void initialize(uint64_t seed);
  void zeroGrads() { m_grads.zero(); }

  const std::vector<Parameter>& params() const { return m_params; }
  // nullptr when this store does not hold the parameter.
  const Parameter* find(const std::string& name) const;
  float* value(const std::string& name);
  float* grad(const std::string& name);
  float* values() { return m_values.data(); }
  float* grads() { return m_grads.data(); }
  const float* values() const { return m_values.data(); }
  const float* grads() const { return m_grads.data(); }
  size_t size() const { return m_total; }

 private:
  std::vector<Parameter> m_params;
  std::map<std::string, size_t> m_index;
  size_t m_total = 0;
  Buffer m_values;
  Buffer m_grads;
};

}  // namespace ms
