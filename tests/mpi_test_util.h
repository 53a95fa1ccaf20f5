// Helpers for the suites that start the engine as real processes (tst_parallel, tst_equivalence): run a
// program, run the engine under mpirun, read a metrics stream, write a config, compare checkpoints.
#pragma once

#include <QString>
#include <QStringList>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "process_util.h"
#include "runtime/safetensors.h"

namespace ms::test {

// The engine under `mpirun --oversubscribe -np N`.
inline ProcessResult runMpi(const QString& mpiexec, const QString& engine, int np, const QStringList& args) {
  return runProcess(mpiexec, QStringList{"--oversubscribe", "-np", QString::number(np), engine} + args);
}

// step -> loss of the lines of one type ("step" or "eval") of a metrics stream.
inline std::map<int, double> metricLosses(const QString& metrics, const char* type) {
  std::map<int, double> out;
  std::ifstream in(metrics.toStdString());
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == type) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

// The last line of a given type, or null.
inline nlohmann::json lastLine(const QString& metrics, const char* type) {
  nlohmann::json found;
  std::ifstream in(metrics.toStdString());
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == type) found = std::move(j);
  }
  return found;
}

// Writes a config on one node of `devices` cpus with seed 4; body holds the other top-level members.
inline QString writeCpuConfig(const QString& dir, const QString& name, const std::string& body, int devices) {
  const QString path = dir + "/" + name + ".json";
  std::ofstream(path.toStdString())
      << "{\"version\": 1, \"name\": \"" << name.toStdString()
      << "\", \"seed\": 4, \"mesh\": {\"nodes\": [{\"name\": \"n0\", \"device\": "
         "\"cpu\", \"count\": "
      << devices << "}]}, " << body << "}";
  return path;
}

// Largest relative L2 distance over the tensors of two safetensors files (every tensor of a must be in b with
// the same size); negative when a file is unreadable or a tensor is missing.
inline double worstRelativeL2(const std::string& a, const std::string& b) {
  auto p1 = readSafetensors(a);
  auto p2 = readSafetensors(b);
  if (!p1.isOk() || !p2.isOk() || p1->tensors.size() != p2->tensors.size()) return -1;
  double worst = 0;
  for (const auto& [name, t] : p1->tensors) {
    const auto* u = p2->find(name);
    if (!u || u->f32.size() != t.f32.size()) return -1;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < t.f32.size(); ++i) {
      diff += double(t.f32[i] - u->f32[i]) * double(t.f32[i] - u->f32[i]);
      norm += double(t.f32[i]) * t.f32[i];
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

}  // namespace ms::test
