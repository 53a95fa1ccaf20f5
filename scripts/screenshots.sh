#!/usr/bin/env bash
# Regenerates the README's screenshots (docs/screenshots/*.png) from the real window, offscreen: the 8-GPU
# example's plan (mesh, predicted timeline, memory bars), GPT-3 on 16384 H100s, and a live 2-stage run on this
# machine's CPUs (its Run dashboard also exported as docs/screenshots/run-dashboard.pdf).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ms_install_packages
ms_build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
QT_QPA_PLATFORM=offscreen "${MS_BUILD_DIR:-build}/app/meshstudio" --screenshots docs/screenshots
