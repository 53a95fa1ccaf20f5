// Launch scripts; see launch_script.h.
#include "plan/launch_script.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "plan/hardware.h"
#include "plan/memory_model.h"

namespace ms {

std::string shellQuote(const std::string& w) {
  if (!w.empty() &&
      w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
          std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

namespace {

bool meshHasGpus(const MeshConfig& mesh) {
  auto resolved = buildMesh(mesh);
  if (!resolved) return false;
  for (const MeshDevice& d : resolved->devices)
    if (isGpuDevice(d.spec)) return true;
  return false;
}

std::string describe(const RunConfig& c) {
  std::ostringstream s;
  const ParallelConfig& p = c.parallel;
  if (p.mode == ParallelMode::ParameterServer)
    s << p.servers << " parameter server(s) and " << p.workers << " worker(s), " << toString(p.consistency)
      << ", on ";
  else
    s << "dp " << p.dp << (p.cp > 1 ? " x cp " + std::to_string(p.cp) : std::string()) << " x tp " << p.tp
      << " x pp " << p.pp << " = " << p.ranks() << " ranks on ";
  s << c.mesh.nodes.size() << (c.mesh.nodes.size() == 1 ? " node" : " nodes");
  std::set<std::string> types;
  for (const NodeConfig& n : c.mesh.nodes) types.insert(n.device);
  s << " (";
  bool first = true;
  for (const std::string& t : types) s << (first ? "" : ", ") << t, first = false;
  s << ")";
  return s.str();
}

std::string runDirOf(const RunConfig& c) {
  return c.training.runDir.empty() ? "runs/" + c.name : c.training.runDir;
}

// The run folder as a script's argument: absolute as given, else under the script's folder ($here).
std::string runDirArgument(const RunConfig& c) {
  const std::string runDir = runDirOf(c);
  return !runDir.empty() && runDir[0] == '/' ? shellQuote(runDir) : "\"$here\"/" + shellQuote(runDir);
}

// "NODE slots=N" a line, in mesh order; empty for a one-node mesh (nothing to place).
std::string hostfileOf(const RunConfig& c) {
  std::string out;
  if (c.mesh.nodes.size() > 1)
    for (const NodeConfig& n : c.mesh.nodes) out += n.name + " slots=" + std::to_string(n.count) + "\n";
  return out;
}

}  // namespace

RunConfig exportedConfig(const RunConfig& config) {
  RunConfig out = config;
  if (config.baseDir.empty()) return out;
  auto absolute = [&](std::vector<std::string>& paths) {
    for (std::string& p : paths) p = config.resolvePath(p);
  };
  absolute(out.data.files);
  absolute(out.data.train);
  absolute(out.data.val);
  if (out.data.kind == DataKind::FashionMnist) out.data.dir = config.resolvePath(out.data.dir);
  for (ProfileConfig& p : out.mesh.profiles) p.file = config.resolvePath(p.file);
  return out;
}

namespace {

// Parameter-server mode: `meshstudio-engine launch` starts and supervises the servers and workers itself
// (engine/ps_launch.h), over ssh on other nodes, or srun inside a Slurm allocation.
LaunchFiles parameterServerLaunchFiles(const RunConfig& config, const std::string& configFile) {
  LaunchFiles out;
  const bool multiNode = config.mesh.nodes.size() > 1;
  const std::string runDirArg = runDirArgument(config);
  out.hostfile = hostfileOf(config);
  std::ostringstream l;
  l << "#!/usr/bin/env bash\n"
    << "# MeshStudio launch script for " << shellQuote(config.name) << ": " << describe(config) << ".\n"
    << "# Generated with " << configFile << (multiNode ? " and hostfile" : "")
    << "; run it from anywhere. `meshstudio-engine launch` starts the servers and\n"
    << "# workers"
    << (multiNode ? " on the hostfile's hosts (ssh to the others; --rsh CMD and --port P before --\n"
                    "# change how and where)"
                  : " on this machine")
    << " and supervises them. Extra arguments go to the job after -- (--resume,\n"
    << "# --overwrite, --metrics FILE). The engine is $MESHSTUDIO_ENGINE, else meshstudio-engine on PATH"
    << (multiNode ? ",\n# at the same path on every node, as are this folder and the data" : "") << ".\n"
    << "set -euo pipefail\n"
    << "here=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n"
    << "engine=\"${MESHSTUDIO_ENGINE:-meshstudio-engine}\"\n"
    << "exec \"$engine\" launch \"$here/" << configFile << "\""
    << (multiNode ? " --hostfile \"$here/hostfile\"" : "") << " -- --run-dir " << runDirArg << " \"$@\"\n";
  out.launchScript = l.str();
  std::ostringstream s;
  const int nodes = static_cast<int>(config.mesh.nodes.size());
  s << "#!/usr/bin/env bash\n"
    << "# MeshStudio Slurm batch script for " << shellQuote(config.name) << ": " << describe(config) << ".\n"
    << "# Submit from this folder: sbatch slurm.sbatch [launch arguments after --]. Slurm picks the nodes:\n"
    << "# the allocation's hosts stand for the mesh's nodes in order, and the launcher, on the first, "
       "starts\n"
    << "# the other nodes' servers and workers with srun.\n"
    << "#SBATCH --job-name=" << shellQuote(config.name) << "\n"
    << "#SBATCH --nodes=" << nodes << "\n"
    << "#SBATCH --ntasks-per-node=1\n"
    << "#SBATCH --output=%x-%j.out\n"
    << "set -euo pipefail\n"
    << "here=\"${SLURM_SUBMIT_DIR:-$(pwd)}\"\n"
    << "engine=\"${MESHSTUDIO_ENGINE:-meshstudio-engine}\"\n"
    << "hosts=\"$here/hostfile.${SLURM_JOB_ID:-local}\"\n"
    << "scontrol show hostnames \"$SLURM_JOB_NODELIST\" > \"$hosts\"\n"
    << "exec \"$engine\" launch \"$here/" << configFile << "\" --hostfile \"$hosts\" --rsh srun -- --run-dir "
    << runDirArg << " \"$@\"\n";
  out.slurmScript = s.str();
  return out;
}

}  // namespace

LaunchFiles launchFiles(const RunConfig& config, const std::string& configFile) {
  if (config.parallel.mode == ParallelMode::ParameterServer)
    return parameterServerLaunchFiles(config, configFile);
  LaunchFiles out;
  const ParallelConfig& p = config.parallel;
  const int ranks = static_cast<int>(p.ranks());
  const bool multiNode = config.mesh.nodes.size() > 1;
  const bool gpu = meshHasGpus(config.mesh);
  const std::string runDirArg = runDirArgument(config);
  out.hostfile = hostfileOf(config);

  std::ostringstream l;
  l << "#!/usr/bin/env bash\n"
    << "# MeshStudio launch script for " << shellQuote(config.name) << ": " << describe(config) << ".\n"
    << "# Generated with " << configFile << (multiNode ? " and hostfile" : "")
    << "; run it from anywhere. Extra arguments go to `meshstudio-engine train`\n"
    << "# (e.g. --resume, --steps N, --metrics FILE). The engine is $MESHSTUDIO_ENGINE, else "
       "meshstudio-engine\n"
    << "# on PATH"
    << (multiNode ? ", at the same path on every node (Open MPI starts remote ranks over ssh)" : "") << ".\n"
    << "set -euo pipefail\n"
    << "here=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n"
    << "engine=\"${MESHSTUDIO_ENGINE:-meshstudio-engine}\"\n"
    << "opts=(--bind-to none)\n"
    << "if [ \"$(id -u)\" -eq 0 ]; then opts+=(--allow-run-as-root); fi\n";
  if (multiNode)
    l << "opts+=(--hostfile \"$here/hostfile\" --map-by slot)\n";
  else
    l << "# One node: ranks share its cores when there are fewer cores than ranks (CPU plans).\n"
      << "if [ \"$(nproc)\" -lt " << ranks << " ]; then opts+=(--oversubscribe); fi\n";
  l << "exec mpirun -np " << ranks << " \"${opts[@]}\" \\\n"
    << "  \"$engine\" train \"$here/" << configFile << "\" --run-dir " << runDirArg << " \"$@\"\n";
  out.launchScript = l.str();

  std::ostringstream s;
  int most = 0;
  bool even = true;
  for (const NodeConfig& n : config.mesh.nodes) {
    if (most && n.count != most) even = false;
    most = std::max(most, n.count);
  }
  const int nodes = static_cast<int>(config.mesh.nodes.size());
  s << "#!/usr/bin/env bash\n"
    << "# MeshStudio Slurm batch script for " << shellQuote(config.name) << ": " << describe(config) << ".\n"
    << "# Submit from this folder: sbatch slurm.sbatch [train arguments]. Slurm picks the nodes, so the "
       "mesh's\n"
    << "# node names are not used; ranks fill each node's tasks in order, as the plan lays them out.\n"
    << "#SBATCH --job-name=" << shellQuote(config.name) << "\n"
    << "#SBATCH --nodes=" << nodes << "\n";
  if (even)
    s << "#SBATCH --ntasks-per-node=" << std::min(most, (ranks + nodes - 1) / nodes) << "\n";
  else
    s << "#SBATCH --ntasks=" << ranks << "\n";
  if (gpu) s << "#SBATCH --gpus-per-node=" << most << "\n";
  if (config.training.threads > 0) s << "#SBATCH --cpus-per-task=" << config.training.threads << "\n";
  s << "#SBATCH --output=%x-%j.out\n"
    << "set -euo pipefail\n"
    << "here=\"${SLURM_SUBMIT_DIR:-$(pwd)}\"\n"
    << "engine=\"${MESHSTUDIO_ENGINE:-meshstudio-engine}\"\n"
    << "mpirun -np " << ranks << " --map-by slot --bind-to none \\\n"
    << "  \"$engine\" train \"$here/" << configFile << "\" --run-dir " << runDirArg << " \"$@\"\n";
  out.slurmScript = s.str();
  return out;
}

Status exportRun(const RunConfig& config, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(dir + ": cannot create the export folder: " + ec.message());
  MS_TRY(saveRunConfig(exportedConfig(config), dir + "/config.json"));
  const LaunchFiles files = launchFiles(config, "config.json");
  auto write = [&](const std::string& name, const std::string& text, bool executable) -> Status {
    const std::string path = dir + "/" + name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) return Status::error(path + ": cannot write the file");
    if (executable && ::chmod(path.c_str(), 0755) != 0)
      return Status::error(path + ": cannot make it executable");
    return Status::ok();
  };
  MS_TRY(write("launch.sh", files.launchScript, true));
  MS_TRY(write("slurm.sbatch", files.slurmScript, true));
  if (!files.hostfile.empty()) MS_TRY(write("hostfile", files.hostfile, false));
  return Status::ok();
}

}  // namespace ms
