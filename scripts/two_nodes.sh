#!/usr/bin/env bash
# A plan really runs across hosts: two "nodes" on this machine, as Linux network namespaces joined by a
# rate-limited virtual link, run a dp 2 x pp 2 GPT from the files `meshstudio-engine export` writes, and
# calibrate measures the link between them. The ctest tst_two_nodes (label mpi) runs it; by hand:
#
#   sudo scripts/two_nodes.sh build/engine/meshstudio-engine
#
# What it does (docs/calibration.md, "Two nodes on one machine"):
# 1. Two network namespaces msN0-ID and msN1-ID (ID: this shell's pid, so parallel runs never collide) with
#    lo up, joined by a veth pair (10.213.7.1/24 in node 0, .2/24 in node 1) that tc's tbf limits to
#    $MS_TWO_NODES_RATE_MBIT (default 200) Mbit/s in each direction: far slower than shared memory. No
#    other interface and no route: traffic stays inside them. /etc/netns/<ns>/hosts names the nodes
#    msnode0 and msnode1 (ip netns exec mounts it over /etc/hosts). tc has no netem here, so the link has
#    the rate limit but no added latency.
# 2. Open MPI reaches node 1 through scripts/netns_agent.sh instead of ssh (OMPI_MCA_plm_rsh_agent): it
#    enters node 1's namespace with a host name of its own (unshare --uts). mpirun runs in node 0's
#    namespace as host msnode0. Open MPI is held to the veth subnet (btl and oob tcp_if_include), btl
#    self,vader,tcp: shared memory inside a node, TCP between the nodes.
# 3. Exports tests/data/two_nodes/gpt-dp2-pp2.json (mesh: msnode0 and msnode1, 2 cpus each; dp 2 x pp 2:
#    stage 0 on msnode0, stage 1 on msnode1) and runs its launch.sh unmodified in node 0, with
#    MESHSTUDIO_ENGINE set to a wrapper that records each rank's host name and network namespace before
#    it runs the engine. Checks: run_end "ok" after every step; ranks 0-1 ran in node 0, 2-3 in node 1;
#    each direction of the veth carried at least the pipeline's activations (forward) or their gradients
#    (backward), steps x batch x seq x width x 4 bytes; every step's loss equals, within 1e-5 relative
#    (tst_equivalence's bound), that of the same config run by plain mpirun on one node (shared memory).
# 4. `meshstudio-engine calibrate --quick --threads 1 --links shm --hosts msnode0,msnode1` in node 0: the
#    profile's "net" link (one rank on each node) must carry a 1 MiB message below the tbf rate and below
#    half the shm link's rate; then `meshstudio-engine plan` of the config on that profile predicts a
#    longer step with inter_link "<profile>.net" than with "<profile>.shm".
#
# Exit codes: 0 passed, 1 a check failed (the message says which, with the log), 77 skipped (not root, or
# network namespaces, veth or tbf not available). Every mpirun runs under timeout; the namespaces, the
# veth, /etc/netns/<ns> and the temporary folder are removed on exit whatever happened (MS_KEEP_TMP=1
# keeps the folder).
set -euo pipefail

usage() {
  echo "usage: $0 MESHSTUDIO_ENGINE" >&2
  exit 2
}
[ $# -eq 1 ] || usage
engine="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$engine" ] || {
  echo "two_nodes.sh: $1 is not an executable" >&2
  exit 2
}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
agent="$here/netns_agent.sh"
config="$here/../tests/data/two_nodes/gpt-dp2-pp2.json"
rate_mbit="${MS_TWO_NODES_RATE_MBIT:-200}"
burst="16kb"
subnet_prefix="10.213.7"
host0=msnode0
host1=msnode1

skip() {
  echo "two_nodes.sh: SKIPPED: $*" >&2
  exit 77
}
fail() {
  echo "two_nodes.sh: FAIL: $*" >&2
  exit 1
}
# fail with the last lines of a log
fail_log() {
  local log="$1"
  shift
  echo "two_nodes.sh: FAIL: $*; the last lines of $log:" >&2
  tail -n 40 "$log" >&2 || true
  exit 1
}
say() { echo "two_nodes.sh: $*"; }

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, veth, tc)"
for cmd in ip tc unshare hostname mpirun timeout python3; do
  command -v "$cmd" > /dev/null || skip "$cmd is not installed"
done

id="$$"
ns0="msN0-$id"
ns1="msN1-$id"
created_ns=()
tmp=""
made_etc_netns=0
[ -d /etc/netns ] || made_etc_netns=1

cleanup() {
  local rc=$?
  set +e
  for ns in "${created_ns[@]}"; do
    # Whatever still runs in our namespaces (a rank mpirun left behind) is ours: end it, by pid.
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null; done
    ip netns del "$ns" 2> /dev/null # takes its end of the veth with it
    rm -rf "/etc/netns/$ns"
  done
  if [ "$made_etc_netns" = 1 ]; then rmdir /etc/netns 2> /dev/null; fi
  if [ -n "$tmp" ]; then
    if [ "${MS_KEEP_TMP:-0}" = 1 ]; then echo "two_nodes.sh: kept $tmp" >&2; else rm -rf "$tmp"; fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$(date +%s.%N)
# Seconds since a `date +%s.%N` time, to 0.1 s.
seconds_since() {
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"
}

# ---- 1. the two nodes ---------------------------------------------------------------------------------
for ns in "$ns0" "$ns1"; do
  ip netns add "$ns" 2> "/dev/null" || skip "cannot create a network namespace (ip netns add $ns)"
  created_ns+=("$ns")
  ip -n "$ns" link set lo up || fail "ip -n $ns link set lo up"
done
# Both ends are created inside the namespaces: nothing appears in this machine's own namespace.
ip link add veth0 netns "$ns0" type veth peer name veth1 netns "$ns1" 2> /dev/null ||
  skip "cannot create a veth pair (ip link add ... type veth)"
ip -n "$ns0" addr add "$subnet_prefix.1/24" dev veth0 || fail "address on veth0"
ip -n "$ns1" addr add "$subnet_prefix.2/24" dev veth1 || fail "address on veth1"
for n in 0 1; do
  ns="msN$n-$id"
  ip -n "$ns" link set "veth$n" up || fail "ip -n $ns link set veth$n up"
  tc -n "$ns" qdisc add dev "veth$n" root tbf rate "${rate_mbit}mbit" burst "$burst" latency 50ms \
    2> /dev/null || skip "tc's tbf qdisc is not available (tc qdisc add dev veth$n root tbf ...)"
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s.1 %s\n%s.2 %s\n' "$subnet_prefix" "$host0" "$subnet_prefix" "$host1" \
    > "/etc/netns/$ns/hosts"
done
if [ "$(ip -n "$ns0" route show default)" != "" ] || [ "$(ip -n "$ns1" route show default)" != "" ]; then
  fail "a namespace has a default route"
fi
netns0="$(ip netns exec "$ns0" readlink /proc/self/ns/net)"
netns1="$(ip netns exec "$ns1" readlink /proc/self/ns/net)"
say "nodes $host0 ($ns0, $subnet_prefix.1) and $host1 ($ns1, $subnet_prefix.2), veth limited to" \
  "$rate_mbit Mbit/s each way (tbf burst $burst)"

tmp="$(mktemp -d /tmp/ms-two-nodes.XXXXXX)"
mkdir -p "$tmp/ranks"
# The engine as launch.sh starts it: first a line naming the rank's host and network namespace.
cat > "$tmp/engine.sh" << EOF
#!/bin/sh
echo "\$(uname -n) \$(readlink /proc/self/ns/net)" > "$tmp/ranks/rank-\${OMPI_COMM_WORLD_RANK:-none}"
exec "$engine" "\$@"
EOF
chmod +x "$tmp/engine.sh"

# A command in node N's namespace, as host N: in_node N COMMAND... (with the Open MPI environment).
in_node() {
  local n="$1"
  shift
  local ns="msN$n-$id" host="msnode$n"
  # shellcheck disable=SC2016 # $1 and $@ are the inner shell's
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' in-node "$host" \
    env MS_NETNS_MAP="$host0=$ns0 $host1=$ns1" \
    OMPI_MCA_plm_rsh_agent="$agent" \
    OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp \
    OMPI_MCA_btl_tcp_if_include="$subnet_prefix.0/24" OMPI_MCA_oob_tcp_if_include="$subnet_prefix.0/24" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$@"
}
tx_bytes() { ip netns exec "msN$1-$id" cat "/sys/class/net/veth$1/statistics/tx_bytes"; }

# ---- 2. the exported plan, run across the two nodes ---------------------------------------------------
"$engine" export "$config" --out "$tmp/export" > "$tmp/export.log" 2>&1 || fail_log "$tmp/export.log" "export"
if [ ! -f "$tmp/export/hostfile" ] || [ ! -x "$tmp/export/launch.sh" ]; then
  fail "export wrote no hostfile or no executable launch.sh"
fi
say "exported to $tmp/export; hostfile: $(tr '\n' ' ' < "$tmp/export/hostfile")"
tx0_before=$(tx_bytes 0)
tx1_before=$(tx_bytes 1)
t0=$(date +%s.%N)
in_node 0 timeout -k 5 60 env MESHSTUDIO_ENGINE="$tmp/engine.sh" "$tmp/export/launch.sh" \
  > "$tmp/run.log" 2>&1 || fail_log "$tmp/run.log" "launch.sh across the two nodes exited with $?"
run_s=$(seconds_since "$t0")
tx0=$(($(tx_bytes 0) - tx0_before))
tx1=$(($(tx_bytes 1) - tx1_before))
metrics="$tmp/export/runs/two-nodes-gpt/metrics.jsonl"
[ -f "$metrics" ] || fail_log "$tmp/run.log" "no $metrics"

# The reference: the same config, plain mpirun on this machine (one node, shared memory).
t0=$(date +%s.%N)
timeout -k 5 60 mpirun -np 4 --oversubscribe --bind-to none --allow-run-as-root --mca pml ob1 \
  --mca btl self,vader "$engine" train "$tmp/export/config.json" --run-dir "$tmp/one-node" \
  > "$tmp/one-node.log" 2>&1 || fail_log "$tmp/one-node.log" "the one-node reference run exited with $?"
ref_s=$(seconds_since "$t0")

python3 - "$metrics" "$tmp/one-node/metrics.jsonl" "$tmp/ranks" "$tmp/export/config.json" "$tx0" "$tx1" \
  "$host0 $netns0" "$host1 $netns1" "$run_s" "$ref_s" << 'EOF' || fail "the run across the two nodes (above)"
import json, os, sys
metrics, reference, ranks_dir, config_file, tx0, tx1, node0, node1, run_s, ref_s = sys.argv[1:]
tx0, tx1 = int(tx0), int(tx1)
config = json.load(open(config_file))
steps = config["training"]["steps"]

def lines(path):
    return [json.loads(l) for l in open(path) if l.strip()]

problems = []
run = lines(metrics)
ends = [l for l in run if l.get("type") == "run_end"]
if not ends or ends[-1].get("status") != "ok":
    problems.append(f"run_end: {ends[-1] if ends else 'none'} (expected status ok)")
losses = {l["step"]: l["loss"] for l in run if l.get("type") == "step"}
ref = {l["step"]: l["loss"] for l in lines(reference) if l.get("type") == "step"}
if sorted(losses) != list(range(1, steps + 1)):
    problems.append(f"steps {sorted(losses)}, expected 1..{steps}")
if sorted(ref) != list(range(1, steps + 1)):
    problems.append(f"one-node reference steps {sorted(ref)}, expected 1..{steps}")
worst = 0.0
for step, loss in sorted(ref.items()):
    if step not in losses:
        continue
    rel = abs(losses[step] - loss) / abs(loss)
    worst = max(worst, rel)
    if not rel <= 1e-5:
        problems.append(f"step {step}: loss {losses[step]!r} across two nodes, {loss!r} on one node")

# Ranks 0-1 (stage 0) on node 0, 2-3 (stage 1) on node 1: --map-by slot over "msnode0 slots=2", ...
want = {0: node0, 1: node0, 2: node1, 3: node1}
for rank, where in want.items():
    path = os.path.join(ranks_dir, f"rank-{rank}")
    got = open(path).read().strip() if os.path.exists(path) else "nothing (it did not start)"
    if got != where:
        problems.append(f"rank {rank} ran on {got}, expected {where}")

# Each direction carried at least the pipeline's messages: every step, the activations of every sample
# (batch x seq x width fp32) cross from stage 0 to stage 1, and their gradients back.
m, t = config["model"], config["training"]
pipeline = steps * t["batch_size"] * t["seq_len"] * m["width"] * 4
for name, got in (("node 0 -> node 1 (activations)", tx0), ("node 1 -> node 0 (gradients)", tx1)):
    if got < pipeline:
        problems.append(f"veth {name} carried {got} bytes, less than the pipeline's {pipeline}")

def median_step(records):
    times = sorted(l["step_time_s"] for l in records if l.get("type") == "step")
    return times[len(times) // 2] if times else float("nan")

print(f"two_nodes.sh: trained {len(losses)} steps across the nodes in {run_s} s (launch.sh, mpirun to "
      f"the end; median step {median_step(run):.3f} s), on one node in {ref_s} s (median step "
      f"{median_step(lines(reference)):.3f} s); last loss {losses.get(steps)!r}, worst relative "
      f"difference from one node {worst:.3g}")
ran = {r: open(os.path.join(ranks_dir, f"rank-{r}")).read().strip() for r in want
       if os.path.exists(os.path.join(ranks_dir, f"rank-{r}"))}
print("two_nodes.sh: ranks (host, network namespace): " + "; ".join(f"{r}: {w}" for r, w in ran.items()))
print(f"two_nodes.sh: veth bytes node 0 -> 1: {tx0}, node 1 -> 0: {tx1} (the pipeline's messages alone: "
      f"{pipeline} each way)")
for p in problems:
    print("two_nodes.sh: FAIL: " + p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

# ---- 3. calibrate the link between the nodes, and plan on it ------------------------------------------
t0=$(date +%s.%N)
in_node 0 timeout -k 5 90 "$engine" calibrate --quick --threads 1 --links shm --hosts "$host0,$host1" \
  --out "$tmp/profile.json" > "$tmp/calibrate.log" 2>&1 ||
  fail_log "$tmp/calibrate.log" "calibrate --hosts exited with $?"
cal_s=$(seconds_since "$t0")

# Two configs on that profile: inter-node link "<profile>.net" (measured) and, to compare, "<profile>.shm".
python3 - "$config" "$tmp/profile.json" "$tmp" << 'EOF' || fail "cannot write the configs on the profile"
import json, os, sys
config_file, profile, tmp = sys.argv[1:]
c = json.load(open(config_file))
folder = os.path.dirname(os.path.abspath(config_file))
c["data"]["files"] = [os.path.join(folder, f) for f in c["data"]["files"]]
for link in ("net", "shm"):
    c["mesh"]["profiles"] = [{"name": "here", "file": profile}]
    for node in c["mesh"]["nodes"]:
        node["device"] = "here"
    c["mesh"]["intra_link"] = "here.shm"
    c["mesh"]["inter_link"] = "here." + link
    json.dump(c, open(os.path.join(tmp, f"plan-{link}.json"), "w"), indent=1)
EOF
for link in net shm; do
  "$engine" plan "$tmp/plan-$link.json" --json > "$tmp/plan-$link.out" 2> "$tmp/plan-$link.log" ||
    fail_log "$tmp/plan-$link.log" "plan with inter_link here.$link"
done

python3 - "$tmp/profile.json" "$tmp/plan-net.out" "$tmp/plan-shm.out" "$rate_mbit" "$host0" "$host1" \
  "$cal_s" << 'EOF' || fail_log "$tmp/calibrate.log" "the calibrated link (above)"
import json, sys
profile_file, plan_net, plan_shm, rate_mbit, host0, host1, cal_s = sys.argv[1:]
profile = json.load(open(profile_file))
links = {l["name"]: l for l in profile["links"]}
problems = []
if sorted(links) != ["net", "shm"]:
    print(f"two_nodes.sh: FAIL: the profile's links are {sorted(links)}, expected net and shm",
          file=sys.stderr)
    sys.exit(1)
net, shm = links["net"], links["shm"]
if host0 not in net["transport"] or host1 not in net["transport"]:
    problems.append(f"net link's transport \"{net['transport']}\" does not name {host0} and {host1}")

def figure(link, op, size):
    for m in link["measurements"]:
        if m["op"] == op and m["bytes"] == size:
            return m
    raise SystemExit(f"two_nodes.sh: FAIL: no {op} of {size} bytes in link {link['name']}")

rate = float(rate_mbit) * 1e6 / 8  # tbf's rate in bytes/s (it counts whole frames, headers too)
big = max(m["bytes"] for m in net["measurements"])
net_bw, shm_bw = figure(net, "sendrecv", big)["algbw"], figure(shm, "sendrecv", big)["algbw"]
net_ar = figure(net, "all_reduce", big)["busbw"]
net_lat, shm_lat = figure(net, "sendrecv", 8)["seconds"], figure(shm, "sendrecv", 8)["seconds"]
if not net_bw < rate:
    problems.append(f"net sendrecv of {big} B at {net_bw:.3g} B/s, not below the tbf rate {rate:.3g} B/s")
# Idle, shm carries 1 MiB some 300 times as fast; on a loaded machine (builds beside the test) it fell to 8
# times, so the bound leaves room.
if not net_bw * 2 < shm_bw:
    problems.append(f"net sendrecv of {big} B at {net_bw:.3g} B/s, not far below shm's {shm_bw:.3g} B/s")
step_net = json.load(open(plan_net))["step_time_s"]
step_shm = json.load(open(plan_shm))["step_time_s"]
if not step_net > step_shm:
    problems.append(f"plan: predicted step {step_net:.4g} s with inter_link here.net, not longer than "
                    f"{step_shm:.4g} s with here.shm")
print(f"two_nodes.sh: calibrate --quick --threads 1 --links shm --hosts {host0},{host1}: {cal_s} s")
print(f"two_nodes.sh: link net ({net['transport']}): sendrecv {big} B {net_bw:.3g} B/s (tbf rate "
      f"{rate:.3g} B/s), all_reduce {big} B busbw {net_ar:.3g} B/s, 8 B one way {net_lat:.3g} s")
print(f"two_nodes.sh: link shm: sendrecv {big} B {shm_bw:.3g} B/s, 8 B one way {shm_lat:.3g} s")
print(f"two_nodes.sh: plan's predicted step: {step_net:.4g} s with inter_link here.net, {step_shm:.4g} s "
      f"with here.shm")
for p in problems:
    print("two_nodes.sh: FAIL: " + p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

say "passed in $(seconds_since "$start") s"
