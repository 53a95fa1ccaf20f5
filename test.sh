#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test with CTest (labels: unit, reference, gui; later mpi
# and gpu). Extra arguments go to ctest, e.g. ./test.sh -L unit or ./test.sh -R tst_config.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/common.sh
ms_install_packages
ms_build
export QT_QPA_PLATFORM=offscreen
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "${MS_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@"
