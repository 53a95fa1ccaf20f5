// Opening the CUDA plugin; see cuda_plugin.h.
#include "runtime/cuda_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

namespace ms {

namespace {

struct PluginOpened {
  const CudaPlugin* plugin = nullptr;
  std::string why;
};

PluginOpened openPlugin() {
  PluginOpened out;
#if !defined(MESHSTUDIO_CUDA_PLUGIN_PATH)
  out.why = "this engine was built without CUDA";
  return out;
#else
  namespace fs = std::filesystem;
  const char* name = "libmeshstudio_cuda.so";
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MESHSTUDIO_CUDA_PLUGIN"); env && *env) {
    candidates.push_back(env);  // the user's choice, and nothing else
  } else {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0)
      candidates.push_back(
          (fs::path(std::string(self, static_cast<size_t>(n))).parent_path() / name).string());
    candidates.push_back(MESHSTUDIO_CUDA_PLUGIN_PATH);
  }
  std::string tried;
  for (const std::string& path : candidates) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = ::dlerror();
      out.why = "the CUDA plugin " + path + " could not be opened: " + (e ? e : "unknown error");
      return out;
    }
    using Entry = const CudaPlugin* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(handle, "meshstudio_cuda_plugin"));
    const CudaPlugin* p = entry ? entry() : nullptr;
    if (!p) {
      out.why = "the CUDA plugin " + path + " has no meshstudio_cuda_plugin entry";
      return out;
    }
    if (p->version != kCudaPluginVersion) {
      out.why = "the CUDA plugin " + path + " is version " + std::to_string(p->version) +
                ", this engine needs " + std::to_string(kCudaPluginVersion) +
                " (a plugin from another build)";
      return out;
    }
    out.plugin = p;  // never closed: its code runs until the process ends
    return out;
  }
  out.why = "the CUDA plugin is missing (looked for " + tried + ")";
  return out;
#endif
}

}  // namespace

const CudaPlugin* cudaPlugin(std::string* why) {
  static const PluginOpened loaded = openPlugin();
  if (why) *why = loaded.why;
  return loaded.plugin;
}

}  // namespace ms
