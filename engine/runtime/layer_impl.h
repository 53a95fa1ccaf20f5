// Internal to the layer implementations (transformer.cpp, gpt_layers.cpp, vit_layers.cpp, mlp_layers.cpp):
// parameter binding and the per-kind factories that makeLayer() dispatches to.
#pragma once

#include <memory>
#include <string>

#include "runtime/layers.h"

namespace ms {

// A parameter's value and gradient pointers, resolved once at construction.
struct BoundParam {
  float* value = nullptr;
  float* grad = nullptr;
};
// The store must hold the parameter (the ModelSpec and the layers are built from the same names; a miss is a
// programming error and throws std::logic_error naming the parameter).
BoundParam bindParam(ParameterStore& params, const std::string& name);

std::unique_ptr<Layer> makeTransformerBlock(const LayerSpec& spec, const LayerContext& ctx, bool causal);
std::unique_ptr<Layer> makeGptEmbedding(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeGptHead(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeVitEmbedding(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeVitHead(const LayerSpec& spec, const LayerContext& ctx);
std::unique_ptr<Layer> makeMlpBlock(const LayerSpec& spec, const LayerContext& ctx, int index);
std::unique_ptr<Layer> makeMlpHead(const LayerSpec& spec, const LayerContext& ctx);

}  // namespace ms
