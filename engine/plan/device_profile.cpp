// Reading a device profile and the cost queries over its curves; see device_profile.h and, for the file,
// docs/calibration.md.
//
// Interpolation is in log space throughout: GEMM and message times span six orders of magnitude over the
// measured sizes, and rates change smoothly in the logarithm of a size, not in the size.
#include "plan/device_profile.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

namespace ms {

namespace {

using nlohmann::json;

constexpr std::array<CollectiveOp, 6> kCollectiveOps = {CollectiveOp::SendRecv,  CollectiveOp::AllReduce,
                                                        CollectiveOp::AllGather, CollectiveOp::ReduceScatter,
                                                        CollectiveOp::AllToAll,  CollectiveOp::Broadcast};

// The JSON walk: every value is type- and range-checked, the first problem is reported with its path.
struct ProfileReader {
  std::string file;
  std::string error;

  bool fail(const std::string& path, const std::string& message) {
    if (error.empty()) error = file + ": " + path + ": " + message;
    return false;
  }
  const json* member(const json& o, const std::string& path, const char* key, bool required = true) {
    if (!o.is_object()) {
      fail(path, "must be an object");
      return nullptr;
    }
    const auto it = o.find(key);
    if (it == o.end()) {
      if (required) fail(path + "/" + key, "missing");
      return nullptr;
    }
    return &*it;
  }
  bool positive(const json& o, const std::string& path, const char* key, double& out) {
    const json* v = member(o, path, key);
    if (!v) return false;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || !(v->get<double>() > 0))
      return fail(path + "/" + key, "must be a number > 0, got " + v->dump());
    out = v->get<double>();
    return true;
  }
  bool count(const json& o, const std::string& path, const char* key, int& out) {
    const json* v = member(o, path, key);
    if (!v) return false;
    if (!v->is_number_integer() || v->get<long long>() < 1 || v->get<long long>() > (1LL << 30))
      return fail(path + "/" + key, "must be an integer >= 1, got " + v->dump());
    out = static_cast<int>(v->get<long long>());
    return true;
  }
  bool text(const json& o, const std::string& path, const char* key, std::string& out, bool required) {
    const json* v = member(o, path, key, required);
    if (!v) return !required;
    if (!v->is_string()) return fail(path + "/" + key, "must be a string, got " + v->dump());
    out = v->get<std::string>();
    return true;
  }
  bool precision(const json& o, const std::string& path, Precision& out) {
    std::string p;
    if (!text(o, path, "precision", p, true)) return false;
    if (p == "fp32")
      out = Precision::Fp32;
    else if (p == "bf16")
      out = Precision::Bf16;
    else
      return fail(path + "/precision", "must be \"fp32\" or \"bf16\", got \"" + p + "\"");
    return true;
  }
  const json* array(const json& o, const std::string& path, const char* key, bool required) {
    const json* v = member(o, path, key, required);
    if (!v) return nullptr;
    if (!v->is_array() || (required && v->empty())) {
      fail(path + "/" + key, required ? "must be a non-empty array" : "must be an array");
      return nullptr;
    }
    return v;
  }
};

// Linear interpolation of ys at x over ascending xs, clamped at both ends.
double interpolateClamped(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (xs.empty()) return 0.0;
  if (x <= xs.front()) return ys.front();
  if (x >= xs.back()) return ys.back();
  const size_t hi = static_cast<size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());
  const size_t lo = hi - 1;
  const double t = (x - xs[lo]) / (xs[hi] - xs[lo]);
  return ys[lo] + t * (ys[hi] - ys[lo]);
}

// The time of `x` units at a rate interpolated in log-log over (x, seconds) points sorted by x: exact at a
// point, the smallest point's time below the range (a fixed cost dominates there) and the largest point's
// rate beyond it.
double profileCurveSeconds(const std::vector<std::pair<double, double>>& points, double x) {
  if (points.empty() || !(x > 0)) return 0.0;
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second * x / points.back().first;
  std::vector<double> lx, ly;
  for (const auto& [px, ps] : points) {
    lx.push_back(std::log(px));
    ly.push_back(std::log(ps));
  }
  return std::exp(interpolateClamped(lx, ly, std::log(x)));
}

std::vector<std::pair<double, double>> sortedProfilePoints(const std::vector<DeviceProfile::Point>& points) {
  std::vector<std::pair<double, double>> out;
  for (const auto& p : points) out.emplace_back(p.x, p.seconds);
  std::sort(out.begin(), out.end());
  return out;
}

template <typename Map>
auto nearestMeasuredThreads(const Map& table, Precision precision, int threads) {
  // The largest measured thread count <= threads at this precision (fp32's when bf16 has none), else the
  // smallest measured.
  for (const Precision p : {precision, Precision::Fp32}) {
    auto best = table.end();
    for (auto it = table.begin(); it != table.end(); ++it) {
      if (it->first.first != p) continue;
      if (best == table.end() || (it->first.second <= threads && it->first.second > best->first.second) ||
          (best->first.second > threads && it->first.second < best->first.second))
        best = it;
    }
    if (best != table.end()) return best;
  }
  return table.end();
}

template <typename Map>
auto nearestMeasuredThreads(const Map& table, int threads) {
  auto best = table.end();
  for (auto it = table.begin(); it != table.end(); ++it)
    if (best == table.end() || (it->first <= threads && it->first > best->first) ||
        (best->first > threads && it->first < best->first))
      best = it;
  return best;
}

}  // namespace

const char* collectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::SendRecv:
      return "sendrecv";
    case CollectiveOp::AllReduce:
      return "all_reduce";
    case CollectiveOp::AllGather:
      return "all_gather";
    case CollectiveOp::ReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::AllToAll:
      return "all_to_all";
    case CollectiveOp::Broadcast:
      return "broadcast";
  }
  return "?";
}

double busBandwidthFactor(CollectiveOp op, int n) {
  n = std::max(n, 1);
  switch (op) {
    case CollectiveOp::AllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveOp::AllGather:
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::AllToAll:
      return double(n - 1) / n;
    case CollectiveOp::SendRecv:
    case CollectiveOp::Broadcast:
      return 1.0;
  }
  return 1.0;
}

double ringSteps(CollectiveOp op, int n) {
  n = std::max(n, 1);
  switch (op) {
    case CollectiveOp::AllReduce:
      return 2.0 * (n - 1);
    case CollectiveOp::SendRecv:
      return 1.0;
    default:
      return double(n - 1);
  }
}

double LinkProfile::seconds(CollectiveOp op, double bytes, int n) const {
  if (!(bytes > 0)) return 0.0;
  if (n <= 1 && op != CollectiveOp::SendRecv) return 0.0;
  if (op == CollectiveOp::SendRecv) {
    const auto it = curves.find(op);
    return it == curves.end() ? 0.0 : profileCurveSeconds(it->second, bytes);
  }
  // The measured op, or all_reduce's curve standing in with its factors.
  CollectiveOp measured = op;
  auto it = curves.find(op);
  if (it == curves.end()) {
    measured = CollectiveOp::AllReduce;
    it = curves.find(measured);
    if (it == curves.end()) return 0.0;
  }
  const auto& points = it->second;
  // The curve at the measured rank count, for the bytes this op would move there at the same bus bandwidth.
  const double busBytes = bytes * busBandwidthFactor(op, n) / busBandwidthFactor(measured, ranks);
  if (measured == op && n == ranks) return profileCurveSeconds(points, bytes);
  const double latency = points.front().second;  // the smallest message: all latency
  const double rest = std::max(0.0, profileCurveSeconds(points, busBytes) - latency);
  const double ring = latency * ringSteps(op, n) / ringSteps(measured, ranks) + rest;
  if (op != CollectiveOp::AllReduce) return ring;
  // A tree: 2 ceil(log2 n) latency hops and the bytes twice, against the measured all_reduce's own.
  const double hops = 2.0 * std::ceil(std::log2(double(n)));
  const double treeRest =
      std::max(0.0, profileCurveSeconds(points, bytes * 2.0 / busBandwidthFactor(measured, ranks)) - latency);
  const double tree = latency * hops / ringSteps(measured, ranks) + treeRest;
  return std::min(ring, tree);
}

double LinkProfile::latency() const {
  const auto it = curves.find(CollectiveOp::SendRecv);
  return it == curves.end() || it->second.empty() ? 0.0 : it->second.front().second;
}

double LinkProfile::peakBusBandwidth() const {
  const auto it = curves.find(CollectiveOp::AllReduce);
  if (it == curves.end() || it->second.empty()) return 0.0;
  const auto& [bytes, seconds] = it->second.back();
  return bytes / seconds * busBandwidthFactor(CollectiveOp::AllReduce, ranks);
}

std::vector<int> DeviceProfile::threadCounts() const {
  std::set<int> counts;
  for (const auto& [key, rows] : gemm) counts.insert(key.second);
  return {counts.begin(), counts.end()};
}

int DeviceProfile::measuredThreads(int threads) const {
  const std::vector<int> counts = threadCounts();
  int best = counts.empty() ? 1 : counts.front();
  for (int c : counts)
    if (c <= threads) best = c;
  return best;
}

namespace {

// The measured time of a GEMM at (m, n, k) from one op's table (DeviceProfile::gemmSeconds).
double gemmTableSeconds(const std::map<std::pair<Precision, int>, std::vector<DeviceProfile::Gemm>>& gemm,
                        Precision precision, int threads, double m, double n, double k) {
  using Gemm = DeviceProfile::Gemm;
  if (!(m > 0 && n > 0 && k > 0)) return 0.0;
  const auto table = nearestMeasuredThreads(gemm, precision, threads);
  if (table == gemm.end()) return 0.0;
  const std::vector<Gemm>& rows = table->second;
  const auto rate = [](const Gemm& g) { return 2.0 * g.m * g.n * g.k / g.seconds; };
  // The axes of the grid, and the measured rate at a grid point (or the best at or below it when the
  // calibration skipped it).
  std::set<int> ms, ns, ks;
  for (const Gemm& g : rows) {
    ms.insert(g.m);
    ns.insert(g.n);
    ks.insert(g.k);
    if (g.m == m && g.n == n && g.k == k) return g.seconds;
  }
  const auto rateAt = [&](int gm, int gn, int gk) {
    double best = 0.0;
    for (const Gemm& g : rows) {
      if (g.m == gm && g.n == gn && g.k == gk) return rate(g);
      if (g.m <= gm && g.n <= gn && g.k <= gk) best = std::max(best, rate(g));
    }
    if (best > 0) return best;
    for (const Gemm& g : rows) best = best > 0 ? std::min(best, rate(g)) : rate(g);  // below the grid
    return best;
  };
  // Per axis: the two grid values around the query (clamped) and the weight of the upper one, in log space.
  struct Bracket {
    int lo, hi;
    double t;
  };
  const auto bracket = [](const std::set<int>& axis, double x) {
    const std::vector<int> v(axis.begin(), axis.end());
    if (x <= v.front()) return Bracket{v.front(), v.front(), 0.0};
    if (x >= v.back()) return Bracket{v.back(), v.back(), 0.0};
    const size_t hi = static_cast<size_t>(std::upper_bound(v.begin(), v.end(), x) - v.begin());
    const double t =
        (std::log(x) - std::log(double(v[hi - 1]))) / (std::log(double(v[hi])) - std::log(double(v[hi - 1])));
    return Bracket{v[hi - 1], v[hi], t};
  };
  const Bracket bm = bracket(ms, m), bn = bracket(ns, n), bk = bracket(ks, k);
  double logRate = 0.0;
  for (int c = 0; c < 8; ++c) {
    const double w = ((c & 1) ? bm.t : 1 - bm.t) * ((c & 2) ? bn.t : 1 - bn.t) * ((c & 4) ? bk.t : 1 - bk.t);
    if (w == 0.0) continue;
    logRate +=
        w * std::log(rateAt((c & 1) ? bm.hi : bm.lo, (c & 2) ? bn.hi : bn.lo, (c & 4) ? bk.hi : bk.lo));
  }
  return 2.0 * m * n * k / std::exp(logRate);
}

}  // namespace

const char* gemmOpName(GemmOp op) {
  switch (op) {
    case GemmOp::Forward:
      return "forward";
    case GemmOp::InputGradient:
      return "input_gradient";
    case GemmOp::WeightGradient:
      return "weight_gradient";
  }
  return "?";
}

double DeviceProfile::gemmSeconds(GemmOp op, Precision precision, int threads, double m, double n,
                                  double k) const {
  switch (op) {
    case GemmOp::Forward:
      return gemmSeconds(precision, threads, m, n, k);
    case GemmOp::InputGradient:
      return gemmInputGradient.empty() ? gemmSeconds(precision, threads, m, k, n)
                                       : gemmTableSeconds(gemmInputGradient, precision, threads, m, n, k);
    case GemmOp::WeightGradient:
      return gemmWeightGradient.empty() ? gemmSeconds(precision, threads, k, n, m)
                                        : gemmTableSeconds(gemmWeightGradient, precision, threads, m, n, k);
  }
  return 0.0;
}

double DeviceProfile::gemmSeconds(Precision precision, int threads, double m, double n, double k) const {
  return gemmTableSeconds(gemm, precision, threads, m, n, k);
}

double DeviceProfile::peakGemmRate(Precision precision, int threads) const {
  const auto table = nearestMeasuredThreads(gemm, precision, threads);
  double best = 0.0;
  if (table != gemm.end())
    for (const Gemm& g : table->second) best = std::max(best, 2.0 * g.m * g.n * g.k / g.seconds);
  return best;
}

namespace {

double profileAttentionSeconds(
    const std::map<std::pair<Precision, int>, std::vector<DeviceProfile::Attention>>& table,
    Precision precision, int threads, double flops, double seq, double headSize, bool backward) {
  if (!(flops > 0)) return 0.0;
  const auto it = nearestMeasuredThreads(table, precision, threads);
  if (it == table.end()) return 0.0;
  // Per measured head size, the log rate interpolated in log seq; then those interpolated in log head size.
  std::map<int, std::vector<DeviceProfile::Attention>> byHeadSize;
  for (const auto& a : it->second) byHeadSize[a.headSize].push_back(a);
  std::vector<double> hx, hy;
  for (auto& [hs, rows] : byHeadSize) {
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
    std::vector<double> lx, ly;
    for (const auto& a : rows) {
      if (!lx.empty() && std::log(double(a.seq)) == lx.back()) continue;
      lx.push_back(std::log(double(a.seq)));
      ly.push_back(std::log(a.flops / (backward ? a.backwardSeconds : a.forwardSeconds)));
    }
    hx.push_back(std::log(double(hs)));
    hy.push_back(interpolateClamped(lx, ly, std::log(std::max(seq, 1.0))));
  }
  const double at = std::log(headSize > 0 ? headSize : 64.0);
  return flops / std::exp(interpolateClamped(hx, hy, at));
}

}  // namespace

double DeviceProfile::attentionForwardSeconds(Precision precision, int threads, double flops, double seq,
                                              double headSize) const {
  return profileAttentionSeconds(attention, precision, threads, flops, seq, headSize, false);
}

double DeviceProfile::attentionBackwardSeconds(Precision precision, int threads, double flops, double seq,
                                               double headSize) const {
  return profileAttentionSeconds(attention, precision, threads, flops, seq, headSize, true);
}

double DeviceProfile::ringAttentionSeconds(bool backward, Precision precision, int threads, double flops,
                                           double blockKeys, double headSize) const {
  return profileAttentionSeconds(ringAttention, precision, threads, flops, blockKeys, headSize, backward);
}

double DeviceProfile::elementwiseSeconds(int threads, double bytes) const {
  const auto it = nearestMeasuredThreads(elementwise, threads);
  return it == elementwise.end() ? 0.0 : profileCurveSeconds(sortedProfilePoints(it->second), bytes);
}

const char* vectorKernelName(VectorKernel kernel) {
  switch (kernel) {
    case VectorKernel::LayerNorm:
      return "layernorm";
    case VectorKernel::Gelu:
      return "gelu";
    case VectorKernel::RmsNorm:
      return "rmsnorm";
    case VectorKernel::Swiglu:
      return "swiglu";
    case VectorKernel::Rope:
      return "rope";
  }
  return "?";
}

bool vectorKernelHasRows(VectorKernel kernel) {
  return kernel == VectorKernel::LayerNorm || kernel == VectorKernel::RmsNorm || kernel == VectorKernel::Rope;
}

bool DeviceProfile::hasVectorKernel(VectorKernel kernel) const {
  return vectorKernels.count(kernel) > 0;
}

double DeviceProfile::vectorKernelSeconds(VectorKernel kernel, bool backward, int threads, double rows,
                                          double width) const {
  if (!(rows > 0 && width > 0)) return 0.0;
  const auto byThreads = vectorKernels.find(kernel);
  if (byThreads == vectorKernels.end()) return 0.0;
  const std::vector<VectorKernelPoint>& table = nearestMeasuredThreads(byThreads->second, threads)->second;
  if (!vectorKernelHasRows(kernel)) {
    rows *= width;
    width = 1;
  }
  // Per measured width, the elements -> seconds curve.
  std::map<double, std::vector<std::pair<double, double>>> byWidth;
  for (const VectorKernelPoint& p : table)
    byWidth[p.width].emplace_back(p.rows * p.width, backward ? p.backwardSeconds : p.forwardSeconds);
  std::vector<double> lw, ls;
  for (auto& [w, points] : byWidth) {
    std::sort(points.begin(), points.end());
    lw.push_back(std::log(w));
    ls.push_back(std::log(profileCurveSeconds(points, rows * width)));
  }
  return std::exp(interpolateClamped(lw, ls, std::log(width)));
}

double DeviceProfile::optimizerSeconds(int threads, double params) const {
  const auto it = nearestMeasuredThreads(optimizer, threads);
  return it == optimizer.end() ? 0.0 : profileCurveSeconds(sortedProfilePoints(it->second), params);
}

double DeviceProfile::peakElementwiseRate(int threads) const {
  const auto it = nearestMeasuredThreads(elementwise, threads);
  double best = 0.0;
  if (it != elementwise.end())
    for (const Point& p : it->second) best = std::max(best, p.x / p.seconds);
  return best;
}

const LinkProfile* DeviceProfile::link(const std::string& name) const {
  for (const LinkProfile& l : links)
    if (l.name == name) return &l;
  return nullptr;
}

Expected<std::shared_ptr<const DeviceProfile>> parseDeviceProfile(const json& doc, const std::string& file) {
  ProfileReader r{file, {}};
  auto p = std::make_shared<DeviceProfile>();
  p->file = file;
  const auto bad = [&]() -> Expected<std::shared_ptr<const DeviceProfile>> { return Status::error(r.error); };
  std::string format;
  if (!r.text(doc, "", "format", format, true)) return bad();
  if (format != "meshstudio-device-profile") {
    r.fail("/format", "must be \"meshstudio-device-profile\", got \"" + format + "\"");
    return bad();
  }
  int version = 0;
  if (!r.count(doc, "", "version", version)) return bad();
  if (version != 1) {
    r.fail("/version", "this engine reads version 1, got " + std::to_string(version));
    return bad();
  }
  const json* machine = r.member(doc, "", "machine");
  if (!machine) return bad();
  if (!r.text(*machine, "/machine", "hostname", p->hostname, false) ||
      !r.text(*machine, "/machine", "cpu", p->cpu, false) ||
      !r.text(*machine, "/machine", "blas", p->blas, false) ||
      !r.text(*machine, "/machine", "created", p->created, false) ||
      !r.text(*machine, "/machine", "command", p->command, false) ||
      !r.count(*machine, "/machine", "cores", p->cores))
    return bad();
  const json* device = r.member(doc, "", "device");
  if (!device) return bad();
  if (!r.text(*device, "/device", "backend", p->backend, true) ||
      !r.positive(*device, "/device", "memory_bytes", p->memoryBytes))
    return bad();

  const json* gemm = r.array(*device, "/device", "gemm", true);
  if (!gemm) return bad();
  for (size_t i = 0; i < gemm->size(); ++i) {
    const json& g = (*gemm)[i];
    const std::string at = "/device/gemm/" + std::to_string(i);
    Precision precision{};
    int threads = 0;
    DeviceProfile::Gemm row;
    std::string op = "forward";  // profiles before 2026-11-29 measured the forward alone, without "op"
    if (!r.precision(g, at, precision) || !r.count(g, at, "threads", threads) ||
        !r.count(g, at, "m", row.m) || !r.count(g, at, "n", row.n) || !r.count(g, at, "k", row.k) ||
        !r.positive(g, at, "seconds", row.seconds) || !r.text(g, at, "op", op, false))
      return bad();
    if (op == gemmOpName(GemmOp::Forward)) {
      p->gemm[{precision, threads}].push_back(row);
    } else if (op == gemmOpName(GemmOp::InputGradient)) {
      p->gemmInputGradient[{precision, threads}].push_back(row);
    } else if (op == gemmOpName(GemmOp::WeightGradient)) {
      p->gemmWeightGradient[{precision, threads}].push_back(row);
    } else {
      r.fail(at + "/op",
             "must be \"forward\", \"input_gradient\" or \"weight_gradient\", got \"" + op + "\"");
      return bad();
    }
  }
  // A backward table must cover the forward's precisions and thread counts, or the queries would mix curves
  // measured on different terms.
  for (const auto* table : {&p->gemmInputGradient, &p->gemmWeightGradient}) {
    if (table->empty()) continue;
    for (const auto& [key, rows] : p->gemm) {
      if (table->count(key)) continue;
      r.fail("/device/gemm", std::string("has no ") +
                                 (table == &p->gemmInputGradient ? "input_gradient" : "weight_gradient") +
                                 " measurement at " + (key.first == Precision::Bf16 ? "bf16" : "fp32") +
                                 " and " + std::to_string(key.second) +
                                 " threads, where the forward has them (measure every op or none)");
      return bad();
    }
  }
  if (std::none_of(p->gemm.begin(), p->gemm.end(),
                   [](const auto& e) { return e.first.first == Precision::Fp32; })) {
    r.fail("/device/gemm", "needs fp32 measurements (bf16 falls back to them, not the other way)");
    return bad();
  }
  if (const json* attention = r.array(*device, "/device", "attention", false)) {
    for (size_t i = 0; i < attention->size(); ++i) {
      const json& a = (*attention)[i];
      const std::string at = "/device/attention/" + std::to_string(i);
      Precision precision{};
      int threads = 0;
      DeviceProfile::Attention row;
      const json* causal = r.member(a, at, "causal", false);
      std::string kernel = "fused";
      if (!r.text(a, at, "kernel", kernel, false)) return bad();
      if (kernel != "fused" && kernel != "ring_block") {
        r.fail(at + "/kernel", "must be \"fused\" or \"ring_block\", got \"" + kernel + "\"");
        return bad();
      }
      if (!r.precision(a, at, precision) || !r.count(a, at, "threads", threads) ||
          !r.count(a, at, "batch", row.batch) || !r.count(a, at, "heads", row.heads) ||
          !r.count(a, at, "seq", row.seq) || !r.count(a, at, "head_size", row.headSize) ||
          !r.positive(a, at, "flops", row.flops) ||
          !r.positive(a, at, "forward_seconds", row.forwardSeconds) ||
          !r.positive(a, at, "backward_seconds", row.backwardSeconds))
        return bad();
      if (causal && !causal->is_boolean()) {
        r.fail(at + "/causal", "must be true or false, got " + causal->dump());
        return bad();
      }
      row.causal = !causal || causal->get<bool>();
      (kernel == "ring_block" ? p->ringAttention : p->attention)[{precision, threads}].push_back(row);
    }
  }
  // Ring blocks, when measured, at every precision and thread count the fused kernel was (as the GEMM ops).
  for (const auto& [key, rows] : p->attention) {
    if (p->ringAttention.empty() || p->ringAttention.count(key)) continue;
    r.fail("/device/attention", std::string("has no ring_block measurement at ") +
                                    (key.first == Precision::Bf16 ? "bf16" : "fp32") + " and " +
                                    std::to_string(key.second) +
                                    " threads, where the fused kernel has them (measure both or only fused)");
    return bad();
  }
  if (!r.error.empty()) return bad();
  const auto readPoints = [&](const char* key, const char* x,
                              std::map<int, std::vector<DeviceProfile::Point>>& out) {
    const json* rows = r.array(*device, "/device", key, true);
    if (!rows) return false;
    for (size_t i = 0; i < rows->size(); ++i) {
      const std::string at = "/device/" + std::string(key) + "/" + std::to_string(i);
      int threads = 0;
      DeviceProfile::Point point;
      if (!r.count((*rows)[i], at, "threads", threads) || !r.positive((*rows)[i], at, x, point.x) ||
          !r.positive((*rows)[i], at, "seconds", point.seconds))
        return false;
      out[threads].push_back(point);
    }
    return true;
  };
  if (!readPoints("elementwise", "bytes", p->elementwise) || !readPoints("optimizer", "params", p->optimizer))
    return bad();
  // Optional (profiles before 2026-11-29 have none): the named elementwise kernels.
  if (const json* kernels = r.array(*device, "/device", "vector_kernels", false)) {
    for (size_t i = 0; i < kernels->size(); ++i) {
      const json& k = (*kernels)[i];
      const std::string at = "/device/vector_kernels/" + std::to_string(i);
      std::string name;
      int threads = 0;
      DeviceProfile::VectorKernelPoint point;
      if (!r.text(k, at, "kernel", name, true) || !r.count(k, at, "threads", threads) ||
          !r.positive(k, at, "rows", point.rows) || !r.positive(k, at, "width", point.width) ||
          !r.positive(k, at, "forward_seconds", point.forwardSeconds) ||
          !r.positive(k, at, "backward_seconds", point.backwardSeconds))
        return bad();
      std::optional<VectorKernel> kernel;
      for (const VectorKernel v : {VectorKernel::LayerNorm, VectorKernel::Gelu, VectorKernel::RmsNorm,
                                   VectorKernel::Swiglu, VectorKernel::Rope})
        if (name == vectorKernelName(v)) kernel = v;
      if (!kernel) {
        r.fail(at + "/kernel",
               "must be \"layernorm\", \"gelu\", \"rmsnorm\", \"swiglu\" or \"rope\", got \"" + name + "\"");
        return bad();
      }
      for (const auto& q : p->vectorKernels[*kernel][threads])
        if (q.rows == point.rows && q.width == point.width) {
          r.fail(at, "a second " + name + " measurement at " + std::to_string(threads) + " threads of " +
                         k["rows"].dump() + " rows of " + k["width"].dump());
          return bad();
        }
      p->vectorKernels[*kernel][threads].push_back(point);
    }
  } else if (!r.error.empty()) {
    return bad();
  }

  const json* links = r.array(doc, "", "links", false);
  if (!links && !r.error.empty()) return bad();
  for (size_t i = 0; links && i < links->size(); ++i) {
    const json& l = (*links)[i];
    const std::string at = "/links/" + std::to_string(i);
    LinkProfile link;
    if (!r.text(l, at, "name", link.name, true) || !r.text(l, at, "transport", link.transport, false) ||
        !r.count(l, at, "ranks", link.ranks))
      return bad();
    if (link.name.empty() ||
        link.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
            std::string::npos) {
      r.fail(at + "/name",
             "must be a non-empty name of letters, digits, '_' and '-', got \"" + link.name + "\"");
      return bad();
    }
    if (p->link(link.name)) {
      r.fail(at + "/name", "duplicate link \"" + link.name + "\"");
      return bad();
    }
    if (link.ranks < 2) {
      r.fail(at + "/ranks",
             "must be >= 2 (a link is measured between ranks), got " + std::to_string(link.ranks));
      return bad();
    }
    const json* measurements = r.array(l, at, "measurements", true);
    if (!measurements) return bad();
    for (size_t j = 0; j < measurements->size(); ++j) {
      const json& mrow = (*measurements)[j];
      const std::string mat = at + "/measurements/" + std::to_string(j);
      std::string opName;
      double bytes = 0, seconds = 0;
      if (!r.text(mrow, mat, "op", opName, true) || !r.positive(mrow, mat, "bytes", bytes) ||
          !r.positive(mrow, mat, "seconds", seconds))
        return bad();
      const auto op = std::find_if(kCollectiveOps.begin(), kCollectiveOps.end(),
                                   [&](CollectiveOp o) { return opName == collectiveOpName(o); });
      if (op == kCollectiveOps.end())
        continue;  // an op this engine does not cost: kept in the file, ignored here
      auto& curve = link.curves[*op];
      if (std::any_of(curve.begin(), curve.end(), [&](const auto& e) { return e.first == bytes; })) {
        r.fail(mat + "/bytes", "a second " + opName + " measurement of " + mrow["bytes"].dump() + " bytes");
        return bad();
      }
      curve.emplace_back(bytes, seconds);
    }
    for (auto& [op, curve] : link.curves) std::sort(curve.begin(), curve.end());
    for (const CollectiveOp needed : {CollectiveOp::SendRecv, CollectiveOp::AllReduce})
      if (link.curves.find(needed) == link.curves.end()) {
        r.fail(at + "/measurements", std::string("needs \"") + collectiveOpName(needed) + "\" measurements");
        return bad();
      }
    p->links.push_back(std::move(link));
  }
  return std::shared_ptr<const DeviceProfile>(std::move(p));
}

Expected<std::shared_ptr<const DeviceProfile>> loadDeviceProfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::error(path + ": cannot read: " + std::strerror(EISDIR));
  if (!in) return Status::error(path + ": cannot read: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  json doc;
  try {
    doc = json::parse(text.str());
  } catch (const json::parse_error& e) {
    return Status::error(path + ": not JSON: " + e.what());
  }
  return parseDeviceProfile(doc, path);
}

Status loadProfiles(RunConfig& config) {
  for (size_t i = 0; i < config.mesh.profiles.size(); ++i) {
    ProfileConfig& p = config.mesh.profiles[i];
    auto loaded = loadDeviceProfile(config.resolvePath(p.file));
    if (!loaded) return Status::error("/mesh/profiles/" + std::to_string(i) + "/file: " + loaded.message());
    p.data = *loaded;
  }
  return Status::ok();
}

}  // namespace ms
