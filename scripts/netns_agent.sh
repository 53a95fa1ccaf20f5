#!/usr/bin/env bash
# Open MPI's remote-shell agent for the two "nodes" of scripts/two_nodes.sh: Open MPI runs it as it would
# run ssh, `netns_agent.sh [ssh options] HOST COMMAND...`, to start its daemon (orted) on HOST. Instead of
# logging in somewhere, it enters HOST's network namespace on this machine (ip netns exec) with a UTS
# namespace of its own whose host name is HOST, and runs COMMAND there through sh, as sshd would run it.
#
# The host-to-namespace map is $MS_NETNS_MAP: "HOST=NAMESPACE" pairs separated by spaces. An unknown host
# fails with its name (so a wrong hostfile never silently runs on this machine's own network).
set -euo pipefail
# Options before the host (plm_rsh_args; Open MPI adds none of its own for this agent) are skipped.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [ $# -lt 2 ]; then
  echo "netns_agent.sh: usage: netns_agent.sh [options] HOST COMMAND..." >&2
  exit 255
fi
host="$1"
shift
ns=""
for pair in ${MS_NETNS_MAP:-}; do
  if [ "${pair%%=*}" = "$host" ]; then ns="${pair#*=}"; fi
done
if [ -z "$ns" ]; then
  echo "netns_agent.sh: host $host is not in MS_NETNS_MAP (\"${MS_NETNS_MAP:-}\")" >&2
  exit 255
fi
# ssh hands the remote shell the words joined by spaces; so does this.
# shellcheck disable=SC2016 # $1 and $2 are the inner shell's
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1" && exec sh -c "$2"' netns-agent "$host" "$*"
