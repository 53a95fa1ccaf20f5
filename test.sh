#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test with CTest (labels: unit, reference, gui, mpi, gpu),
# then the sanitizer build and the fuzzers (scripts/sanitize.sh). Extra arguments go to ctest, e.g.
# ./test.sh -L unit or ./test.sh -R tst_config; with them the sanitizer part is skipped unless MS_SANITIZE=1.
# MS_SANITIZE=0 always skips it.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/common.sh
ms_install_packages
ms_build
export QT_QPA_PLATFORM=offscreen
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd "${MS_BUILD_DIR:-build}" && ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@")
if [ "${MS_SANITIZE:-$([ $# -eq 0 ] && echo 1 || echo 0)}" != 0 ]; then
  scripts/sanitize.sh
fi
