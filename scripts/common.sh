# Shared set-up for ./studio.sh and ./test.sh: install the Debian packages that are missing (one apt line),
# then configure and build. Idempotent: with everything installed and built it only asks dpkg and ninja.
# shellcheck shell=bash

MS_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  qt6-base-dev qt6-svg-dev libqcustomplot-dev libgl-dev xvfb xauth
  libopenblas-openmp-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev zlib1g-dev libssl-dev libzmq3-dev cppzmq-dev
  dataset-fashion-mnist fortunes python3-torch python3-numpy iproute2
  clang libclang-rt-14-dev libomp-14-dev llvm-14
)

ms_install_packages() {
  local missing=()
  local p
  for p in "${MS_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "Installing missing packages: ${missing[*]}" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Build directory: build/ (Release). MS_BUILD_DIR overrides it. A unity build (CMake batches each library's
# sources into a few translation units, which then parse the Qt and nlohmann_json headers and instantiate
# their templates once a batch): with the tests' own code at -O1 (tests/CMakeLists.txt), a fresh clone's
# configure and build took about 15 minutes on the 2-core AMD EPYC instead of about 22 (README's testing section).
# A developer's own build/ configured without it keeps one translation unit a file (quicker rebuilds of one
# edited file).
ms_build() {
  local dir="${MS_BUILD_DIR:-build}"
  local gen=()
  if command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S . -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON
  fi
  cmake --build "$dir" --parallel "$(nproc)"
}
