// The cnn's layers (plan/model_spec.cpp cnnSpec: a ResNet of basic blocks, He et al. 2016): the stem
// (3x3 convolution, BatchNorm, ReLU), the residual blocks (two 3x3 convolutions with BatchNorm and ReLU, a
// 1x1 convolution with BatchNorm as the shortcut where the shape changes) and the classifier head (global
// average pooling, linear, softmax cross-entropy; classifier_layers.cpp, which the head shares with the
// other classifiers). Activations are NCHW: (B, C, side, side); the images come as (B, S*S), one channel.
//
// BatchNorm (Ioffe and Szegedy 2015, algorithm 1; the backward of their section 3) runs in the Backend's
// parts: per-channel sums (double), moments, the running statistics (PyTorch's momentum and unbiased running
// variance), the element-wise apply; in backward the two gradient sums and the apply. With "batchnorm":
// "sync" the sums of forward and backward are all-reduced over the data-parallel group between the parts, as
// PyTorch's SyncBatchNorm does, so every replica normalises with the statistics of the whole batch (and its
// running statistics stay equal to the other replicas'); "local" normalises with each replica's own
// microbatch, and each replica keeps its own running statistics (the checkpoint holds data-parallel rank
// 0's). Evaluation normalises with the running statistics.
//
// What each layer keeps for backward is what LayerSpec::activationBytesPerSample counts (model_spec.cpp),
// plus each BatchNorm's per-channel mean and 1/std of the microbatch (2 C floats, not counted there).
#include <cmath>
#include <string>
#include <vector>

#include "runtime/layer_impl.h"

namespace ms {
namespace {

// One BatchNorm2d: its parameters (weight, bias), its running statistics (the layer's buffers, fp32 backend
// memory, initialised from the spec: mean 0, variance 1) and, per slot, the microbatch's mean and 1/std.
class BatchNorm {
 public:
  BatchNorm(const LayerContext& ctx, const LayerSpec& spec, const std::string& name)
      : m_be(ctx.backend),
        m_eps(static_cast<float>(ctx.model.bnEps)),
        m_momentum(static_cast<float>(ctx.model.bnMomentum)),
        m_group(ctx.batchNormGroup),
        m_ranks(ctx.batchNormGroup ? ctx.batchNormRanks : 1),
        m_runningMean(0, MemoryCategory::Parameters, ctx.tracker),
        m_runningVar(0, MemoryCategory::Parameters, ctx.tracker),
        m_sums(0, MemoryCategory::Workspace, ctx.tracker),
        m_stats(ctx.tracker) {
    m_w = bindParam(ctx.params, name + ".weight");
    m_b = bindParam(ctx.params, name + ".bias");
    m_C = static_cast<int>(m_w.info().spec.shape[0]);
    for (const ParamSpec& b : spec.buffers) {
      if (b.name == name + ".running_mean") m_meanSpec = &b;
      if (b.name == name + ".running_var") m_varSpec = &b;
    }
    if (!m_meanSpec || !m_varSpec)
      throw std::logic_error("cnn layer " + spec.name + ": no running statistics for " + name);
    m_runningMean.reserve(m_C);
    m_runningVar.reserve(m_C);
    resetRunning();
    m_sums.reserve(size_t(12) * m_C);  // 6 C doubles: sums, then gradient sums and their local copies
  }

  int channels() const { return m_C; }

  void resetRunning() {
    const std::vector<float> zeros(static_cast<size_t>(m_C), 0.0f), ones(static_cast<size_t>(m_C), 1.0f);
    m_be.upload(m_runningMean.data(), zeros.data(), zeros.size() * sizeof(float));
    m_be.upload(m_runningVar.data(), ones.data(), ones.size() * sizeof(float));
  }

  std::vector<LayerBuffer> buffers() {
    return {{m_meanSpec, m_runningMean.data()}, {m_varSpec, m_runningVar.data()}};
  }

  // out (B, C, S) = BatchNorm(x); training: the microbatch's statistics (all replicas' under sync), which
  // also update the running statistics; evaluation: the running statistics. out may alias x.
  void forward(float* out, const float* x, int B, int S, bool training, int slot) {
    Stats& st = m_stats[slot];
    st.mean.reserve(m_C);
    st.rstd.reserve(m_C);
    if (!training) {
      // 1 / sqrt(running var + eps), on the host (C floats) as PyTorch forms it in fp32.
      std::vector<float> var(static_cast<size_t>(m_C)), mean(static_cast<size_t>(m_C));
      m_be.download(var.data(), m_runningVar.data(), var.size() * sizeof(float));
      m_be.download(mean.data(), m_runningMean.data(), mean.size() * sizeof(float));
      for (float& v : var) v = 1.0f / std::sqrt(v + m_eps);
      m_be.upload(st.rstd.data(), var.data(), var.size() * sizeof(float));
      m_be.upload(st.mean.data(), mean.data(), mean.size() * sizeof(float));
      m_be.batchNormApply(out, x, st.mean.data(), st.rstd.data(), m_w.value(), m_b.value(), B, m_C, S);
      return;
    }
    double* sum = sums(0);
    double* sumSq = sums(1);
    double* var = sums(2);
    m_be.batchNormStats(sum, sumSq, x, B, m_C, S);
    if (m_group) allReduce(sum, 2);
    const double count = double(B) * S * m_ranks;
    m_be.batchNormMoments(st.mean.data(), st.rstd.data(), var, sum, sumSq, count, m_C, m_eps);
    m_be.batchNormUpdateRunning(m_runningMean.data(), m_runningVar.data(), st.mean.data(), var, count, m_C,
                                m_momentum);
    m_be.batchNormApply(out, x, st.mean.data(), st.rstd.data(), m_w.value(), m_b.value(), B, m_C, S);
  }

  // dx (B, C, S) += the input gradient; the weight and bias gradients accumulate. x: forward's input.
  void backward(float* dx, const float* dy, const float* x, int B, int S, int slot) {
    const Stats& st = m_stats[slot];
    double* sumDy = sums(0);
    double* sumDyXhat = sums(1);
    m_be.batchNormGradStats(sumDy, sumDyXhat, dy, x, st.mean.data(), st.rstd.data(), B, m_C, S);
    const double* localDy = sumDy;
    const double* localDyXhat = sumDyXhat;
    if (m_group) {
      double* local = sums(2);  // this rank's sums (2 C doubles), for the parameter gradients
      m_be.copy(local, sumDy, size_t(2) * m_C * sizeof(double));
      localDy = local;
      localDyXhat = local + m_C;
      allReduce(sumDy, 2);
    }
    const double count = double(B) * S * m_ranks;
    m_be.batchNormBackwardApply(dx, m_w.grad(), m_b.grad(), dy, x, st.mean.data(), st.rstd.data(),
                                m_w.value(), sumDy, sumDyXhat, localDy, localDyXhat, count, B, m_C, S);
  }

  void releaseSlot(int slot) { m_stats.release(slot); }

 private:
  struct Stats {
    explicit Stats(MemoryTracker* t)
        : mean(0, MemoryCategory::Activations, t), rstd(0, MemoryCategory::Activations, t) {}
    Buffer mean, rstd;
  };
  // C doubles at block i of the scratch (blocks 0 and 1 contiguous: one all-reduce sends both).
  double* sums(int i) { return reinterpret_cast<double*>(m_sums.data()) + size_t(i) * m_C; }
  void allReduce(double* x, int blocks) {
    const Status s = m_group->allReduce(x, x, size_t(blocks) * m_C, CommType::F64, ReduceOp::Sum);
    if (!s) throw CommFailure("synchronised BatchNorm all-reduce: " + s.message());
  }

  Backend& m_be;
  float m_eps, m_momentum;
  Communicator* m_group;
  int m_ranks;
  int m_C = 0;
  BoundParam m_w, m_b;
  const ParamSpec* m_meanSpec = nullptr;
  const ParamSpec* m_varSpec = nullptr;
  Buffer m_runningMean, m_runningVar, m_sums;
  SlotCaches<Stats> m_stats;
};

// Per-slot activations of the stem and the blocks (model_spec.cpp lists which each keeps).
struct ConvActs {
  explicit ConvActs(MemoryTracker* t)
      : a(0, MemoryCategory::Activations, t),
        h(0, MemoryCategory::Activations, t),
        c(0, MemoryCategory::Activations, t),
        d(0, MemoryCategory::Activations, t),
        y(0, MemoryCategory::Activations, t) {}
  Buffer a, h, c, d, y;
};

Conv2dShape conv(int B, int C, int side, int OC, int k, int stride, int pad) {
  Conv2dShape s;
  s.B = B;
  s.C = C;
  s.H = s.W = side;
  s.OC = OC;
  s.KH = s.KW = k;
  s.stride = stride;
  s.pad = pad;
  return s;
}

// The stem: conv1 (3x3, 1 -> c0, stride 1, padding 1), bn1, ReLU. Keeps conv1's output and its own output.
class CnnStem final : public Layer {
 public:
  CnnStem(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_be(ctx.backend),
        m_S(ctx.model.imageSize),
        m_bn(ctx, spec, "bn1"),
        m_caches(ctx.tracker),
        m_ws(ctx.workspace) {
    m_w = bindParam(ctx.params, "conv1.weight");
    m_C = m_bn.channels();
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_C * m_S * m_S; }
  std::vector<LayerBuffer> buffers() override { return m_bn.buffers(); }

  void forward(const float*, float* y, const BatchView& batch, const ForwardMode& mode, int slot) override {
    const int B = batch.B, S2 = m_S * m_S;
    const size_t n = size_t(B) * m_C * S2;
    ConvActs& c = m_caches[slot];
    c.a.reserve(n);
    c.y.reserve(n);
    m_be.conv2dForward(c.a.data(), batch.images, m_w.gemm(), nullptr, conv(B, 1, m_S, m_C, 3, 1, 1));
    m_bn.forward(y, c.a.data(), B, S2, mode.training, slot);
    m_be.reluForward(y, y, n);
    m_be.copy(c.y.data(), y, n * sizeof(float));
  }

  void backward(const float*, const float* dy, float*, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    const int B = batch.B, S2 = m_S * m_S;
    const size_t n = size_t(B) * m_C * S2;
    ConvActs& c = m_caches[slot];
    float* dpre = m_ws->get(0, n, true);  // the gradient before the ReLU
    m_be.reluBackward(dpre, dy, c.y.data(), n);
    float* da = m_ws->get(1, n, true);  // of conv1's output
    m_bn.backward(da, dpre, c.a.data(), B, S2, slot);
    m_be.conv2dBackward(nullptr, m_w.grad(), nullptr, da, batch.images, m_w.gemm(),
                        conv(B, 1, m_S, m_C, 3, 1, 1));
  }
  void releaseSlot(int slot) override {
    m_caches.release(slot);
    m_bn.releaseSlot(slot);
  }

 private:
  Backend& m_be;
  int m_S, m_C = 0;
  BoundParam m_w;
  BatchNorm m_bn;
  SlotCaches<ConvActs> m_caches;
  Workspace* m_ws;
};

// "layer{s}.{i}." of a block's parameters (its first is "layer{s}.{i}.conv1.weight").
std::string blockPrefix(const LayerSpec& spec) {
  const std::string& first = spec.params.front().name;
  const size_t end = first.rfind("conv1.weight");
  if (end == std::string::npos || first.rfind("layer", 0) != 0)
    throw std::logic_error("cnn block " + spec.name + ": unexpected first parameter " + first);
  return first.substr(0, end);
}

// A basic block: y = ReLU(bn2(conv2(ReLU(bn1(conv1(x))))) + shortcut(x)), shortcut = x, or bn(1x1 conv(x))
// with stride 2 where the side or the channels change. Keeps conv1's output (a), the ReLU'd bn1 (h),
// conv2's output (c), the shortcut convolution's output (d) and its own output (y).
class CnnBlock final : public Layer {
 public:
  CnnBlock(const LayerSpec& spec, const LayerContext& ctx)
      : Layer(spec),
        m_be(ctx.backend),
        m_prefix(blockPrefix(spec)),
        m_projection(spec.params.size() > 6),
        m_bn1(ctx, spec, m_prefix + "bn1"),
        m_bn2(ctx, spec, m_prefix + "bn2"),
        m_caches(ctx.tracker),
        m_ws(ctx.workspace) {
    m_w1 = bindParam(ctx.params, m_prefix + "conv1.weight");
    m_w2 = bindParam(ctx.params, m_prefix + "conv2.weight");
    const std::vector<int64_t>& shape = m_w1.info().spec.shape;  // (c, cin, 3, 3)
    m_C = static_cast<int>(shape[0]);
    m_Cin = static_cast<int>(shape[1]);
    if (m_projection) {
      m_wd = bindParam(ctx.params, m_prefix + "downsample.0.weight");
      m_bnd = std::make_unique<BatchNorm>(ctx, spec, m_prefix + "downsample.1");
    }
    // "layer{s + 1}.{i}.": the first block of every stage after the first halves the side (stride 2).
    const size_t dot = m_prefix.find('.');
    const int stage = std::stoi(m_prefix.substr(5, dot - 5)) - 1;
    const int index = std::stoi(m_prefix.substr(dot + 1));
    const std::vector<int> sides = cnnStageSides(ctx.model);
    m_side = sides[size_t(stage)];
    m_stride = stage > 0 && index == 0 ? 2 : 1;
    m_sideIn = m_stride == 2 ? sides[size_t(stage) - 1] : m_side;
  }
  int64_t outputFloats(int B) const override { return int64_t(B) * m_C * m_side * m_side; }
  std::vector<LayerBuffer> buffers() override {
    std::vector<LayerBuffer> all = m_bn1.buffers();
    for (const LayerBuffer& b : m_bn2.buffers()) all.push_back(b);
    if (m_bnd)
      for (const LayerBuffer& b : m_bnd->buffers()) all.push_back(b);
    return all;
  }

  void forward(const float* x, float* y, const BatchView& batch, const ForwardMode& mode, int slot) override {
    const int B = batch.B, S2 = m_side * m_side;
    const size_t n = size_t(B) * m_C * S2;
    ConvActs& c = m_caches[slot];
    for (Buffer* b : {&c.a, &c.h, &c.c, &c.y}) b->reserve(n);
    m_be.conv2dForward(c.a.data(), x, m_w1.gemm(), nullptr, conv1(B));
    m_bn1.forward(c.h.data(), c.a.data(), B, S2, mode.training, slot);
    m_be.reluForward(c.h.data(), c.h.data(), n);
    m_be.conv2dForward(c.c.data(), c.h.data(), m_w2.gemm(), nullptr, conv2(B));
    m_bn2.forward(y, c.c.data(), B, S2, mode.training, slot);
    if (m_projection) {
      c.d.reserve(n);
      m_be.conv2dForward(c.d.data(), x, m_wd.gemm(), nullptr, shortcut(B));
      float* s = m_ws->get(0, n, false);
      m_bnd->forward(s, c.d.data(), B, S2, mode.training, slot);
      m_be.accumulate(y, s, n);
    } else {
      m_be.accumulate(y, x, n);
    }
    m_be.reluForward(y, y, n);
    m_be.copy(c.y.data(), y, n * sizeof(float));
  }

  void backward(const float* x, const float* dy, float* dx, const BatchView& batch, int slot,
                BackwardPart part) override {
    if (part == BackwardPart::Weight) return;
    const int B = batch.B, S2 = m_side * m_side;
    const size_t n = size_t(B) * m_C * S2;
    ConvActs& c = m_caches[slot];
    float* g = m_ws->get(0, n, true);  // the gradient of the sum before the last ReLU
    m_be.reluBackward(g, dy, c.y.data(), n);
    float* dc = m_ws->get(1, n, true);  // of conv2's output
    m_bn2.backward(dc, g, c.c.data(), B, S2, slot);
    float* dh = m_ws->get(2, n, true);  // of h (conv2's input)
    m_be.conv2dBackward(dh, m_w2.grad(), nullptr, dc, c.h.data(), m_w2.gemm(), conv2(B));
    float* dhp = m_ws->get(3, n, true);  // before the first ReLU
    m_be.reluBackward(dhp, dh, c.h.data(), n);
    float* da = m_ws->get(1, n, true);  // of conv1's output (dc is done with)
    m_bn1.backward(da, dhp, c.a.data(), B, S2, slot);
    m_be.conv2dBackward(dx, m_w1.grad(), nullptr, da, x, m_w1.gemm(), conv1(B));
    if (m_projection) {
      float* dd = m_ws->get(2, n, true);  // of the shortcut convolution's output (dh is done with)
      m_bnd->backward(dd, g, c.d.data(), B, S2, slot);
      m_be.conv2dBackward(dx, m_wd.grad(), nullptr, dd, x, m_wd.gemm(), shortcut(B));
    } else if (dx) {
      m_be.accumulate(dx, g, n);
    }
  }
  void releaseSlot(int slot) override {
    m_caches.release(slot);
    m_bn1.releaseSlot(slot);
    m_bn2.releaseSlot(slot);
    if (m_bnd) m_bnd->releaseSlot(slot);
  }

 private:
  Conv2dShape conv1(int B) const { return conv(B, m_Cin, m_sideIn, m_C, 3, m_stride, 1); }
  Conv2dShape conv2(int B) const { return conv(B, m_C, m_side, m_C, 3, 1, 1); }
  Conv2dShape shortcut(int B) const { return conv(B, m_Cin, m_sideIn, m_C, 1, m_stride, 0); }

  Backend& m_be;
  std::string m_prefix;  // "layer{s}.{i}."
  bool m_projection;
  int m_C = 0, m_Cin = 0, m_side = 0, m_sideIn = 0, m_stride = 1;
  BoundParam m_w1, m_w2, m_wd;
  BatchNorm m_bn1, m_bn2;
  std::unique_ptr<BatchNorm> m_bnd;
  SlotCaches<ConvActs> m_caches;
  Workspace* m_ws;
};

}  // namespace

std::unique_ptr<Layer> makeCnnStem(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<CnnStem>(spec, ctx);
}
std::unique_ptr<Layer> makeCnnBlock(const LayerSpec& spec, const LayerContext& ctx) {
  return std::make_unique<CnnBlock>(spec, ctx);
}

}  // namespace ms
