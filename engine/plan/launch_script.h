// Launch scripts for headless runs: what File > Export and `meshstudio-engine export` write beside the config
// so the plan runs on a cluster without the studio. One generator for both, so the studio and the command
// line cannot drift apart.
//
// What the files do (all take the engine from $MESHSTUDIO_ENGINE, else meshstudio-engine on PATH):
// - launch.sh: `mpirun -np <dp*cp*tp*pp>` over the mesh's nodes. Several nodes: a hostfile with one line per
// mesh
//   node ("<name> slots=<devices>"), and --map-by slot, which fills node 0's slots first, then node 1's: the
//   node-major order in which the plan lays rank r on device r (plan/layout.h). One node: runs locally,
//   oversubscribing when the node has fewer cores than ranks (CPU plans). Extra arguments go to `train`.
// - slurm.sbatch: the same run inside a Slurm allocation of as many nodes as the mesh (submitted from the
//   export folder: `cd DIR && sbatch slurm.sbatch`); GPUs requested per node for GPU meshes.
// - parameter_server mode: launch.sh runs `meshstudio-engine launch` (engine/ps_launch.h), which starts and
//   supervises the servers and workers itself, with the hostfile for several nodes; slurm.sbatch takes one
//   task a node, writes the allocation's hosts as the hostfile and has the launcher start the other nodes'
//   processes with srun. Extra arguments go to the job after --.
// Ranks are never bound to one core (--bind-to none): a rank runs its threads (training.threads, or cores /
// local ranks) and Open MPI's default binding for small jobs would pin them all to one core.
//
// What always holds: the scripts pass `bash -n`; every value from the config that reaches a shell line is
// quoted; the rank count is the plan's dp * cp * tp * pp.
#pragma once

#include <string>

#include "plan/run_config.h"

namespace ms {

struct LaunchFiles {
  std::string hostfile;      // empty for a one-node mesh
  std::string launchScript;  // launch.sh
  std::string slurmScript;   // slurm.sbatch
};

// configFile: the config's file name inside the export folder (normally "config.json").
LaunchFiles launchFiles(const RunConfig& config, const std::string& configFile = "config.json");

// The config as written into an export folder: relative data and device-profile paths made absolute against
// baseDir (the folder moves, the data and the profiles do not).
RunConfig exportedConfig(const RunConfig& config);

// Writes config.json, launch.sh (executable), slurm.sbatch and, for several nodes, hostfile into `dir`
// (created when missing). Errors name the file.
Status exportRun(const RunConfig& config, const std::string& dir);

// POSIX shell single-quoting (words of safe characters are left bare).
std::string shellQuote(const std::string& word);

}  // namespace ms
