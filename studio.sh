#!/usr/bin/env bash
# Installs what is missing, builds, and starts the studio on its default example project.
# Extra arguments go to the studio (e.g. a project file to open).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/common.sh
ms_install_packages
ms_build
if [ $# -eq 0 ]; then set -- resources/examples/gpt-fortunes.json; fi
exec "${MS_BUILD_DIR:-build}/app/meshstudio" "$@"
