// ParameterStore; see parameters.h.
#include "runtime/parameters.h"

#include "runtime/random.h"

namespace ms {

ParameterStore::ParameterStore(const ModelSpec& spec, const std::vector<int>& layerIndices,
                               MemoryTracker* tracker) {
  for (int li : layerIndices) {
    for (const ParamSpec& p : spec.layers[li].params) {
      Parameter param{p, m_total, static_cast<size_t>(p.numel())};
      m_index[p.name] = m_params.size();
      m_params.push_back(param);
      // Keep every parameter 16-float aligned so kernels see aligned rows.
      m_total += (param.numel + 15) / 16 * 16;
    }
  }
  m_values = Buffer(m_total, MemoryCategory::Parameters, tracker);
  m_grads = Buffer(m_total, MemoryCategory::Gradients, tracker);
}

void ParameterStore::initialize(uint64_t seed) {
  for (const Parameter& p : m_params) {
    float* v = m_values.data() + p.offset;
    const uint64_t key = hashCombine(seed, hashString(p.spec.name), 0);
    switch (p.spec.init) {
      case ParamSpec::Init::Zeros:
        for (size_t i = 0; i < p.numel; ++i) v[i] = 0.0f;
        break;
      case ParamSpec::Init::Ones:
        for (size_t i = 0; i < p.numel; ++i) v[i] = 1.0f;
        break;
      case ParamSpec::Init::Normal:
        for (size_t i = 0; i < p.numel; ++i) v[i] = static_cast<float>(p.spec.std * normalAt(key, i));
        break;
    }
  }
}

const Parameter* ParameterStore::find(const std::string& name) const {
  auto it = m_index.find(name);
  return it == m_index.end() ? nullptr : &m_params[it->second];
}

float* ParameterStore::value(const std::string& name) {
  const Parameter* p = find(name);
  return p ? m_values.data() + p->offset : nullptr;
}

float* ParameterStore::grad(const std::string& name) {
  const Parameter* p = find(name);
  return p ? m_grads.data() + p->offset : nullptr;
}

}  // namespace ms
