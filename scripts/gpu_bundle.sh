#!/bin/sh
# Packs what a GPU machine without Open MPI, Qt or OpenBLAS needs to run the engine, the GPU tests and
# bench/gpu_vs_torch.py from a build made here: .gpu/bundle.tar.xz (bin/: the programs; lib/: every shared
# library they load except the C library's and CUDA's, which the GPU machine has; about 20 MB, under the
# device tool's 64 MiB carry limit) and .gpu/run.sh, which unpacks it into /tmp/ms-gpu once, sets the library
# path (CUDA's included) and runs its arguments. .gpu/ is git-ignored; a GPU machine gets it as a carried path.
#
#   scripts/gpu_bundle.sh [BUILD_DIR]                 (default: build-gpu, configured without the studio)
#   then on the GPU machine:  .gpu/run.sh tst_backend gpu
#                             .gpu/run.sh tst_cuda_kernels
#                             .gpu/run.sh mpirun --allow-run-as-root -np 1 /tmp/ms-gpu/bin/tst_nccl
#                             .gpu/run.sh bench_attention
#                             .gpu/run.sh meshstudio-engine train CONFIG
#                             .gpu/run.sh python3 bench/gpu_vs_torch.py --engine /tmp/ms-gpu/wrap/meshstudio-engine
#
#                             .gpu/run.sh mpirun --allow-run-as-root -np 2 /tmp/ms-gpu/bin/meshstudio-engine train CONFIG
#
# Open MPI travels too (ompi/: orterun, its and PMIx's components, help files, the libraries they load) and is
# relocated through Open MPI's OPAL_* installation-directory variables (checked here with the system's Open MPI
# hidden in a mount namespace: a 4-rank tp2 pp2 run trained).
set -eu
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHSTUDIO_BUILD_UI=OFF >/dev/null
fi
ninja -C "$build" meshstudio-engine meshstudio_cuda tst_backend tst_cuda_kernels tst_nccl bench_attention ms_kernel_profile >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
# The engine's CUDA plugin (engine/runtime/cuda_plugin.h) beside it: the engine opens it from there.
cp "$build/engine/meshstudio-engine" "$build/engine/libmeshstudio_cuda.so" "$build/tests/tst_backend" \
  "$build/tests/tst_cuda_kernels" "$build/tests/tst_nccl" "$build/bench/bench_attention" "$stage/bin/"
# The kernel profiler (bench/kernel_profile.cpp, a CUDA injection library) and its CUPTI, the one it was built
# against: lib/ is on the packed programs' library path.
cp "$build/bench/libms_kernel_profile.so" "$stage/lib/"
for exe in "$stage"/bin/* "$stage/lib/libms_kernel_profile.so"; do
  ldd "$exe" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux*) ;;  # the GPU machine's own
    libstdc++.so* | libgcc_s.so*) ;;  # the GPU machine's are newer, and backward compatible
    libcuda.so* | libcudart.so* | libcublas*.so* | libnccl.so* | libnvidia*) ;;   # CUDA's, there too
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
# Open MPI, relocatable: the programs' libraries already include libmpi and its runtime's.
ompi="$stage/ompi"
mkdir -p "$ompi/bin" "$ompi/lib/openmpi3" "$ompi/lib/pmix" "$ompi/share" "$ompi/etc"
cp -L "$(command -v orterun)" "$ompi/bin/orterun"
cp /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so "$ompi/lib/openmpi3/"
cp /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so "$ompi/lib/pmix/"
cp -r /usr/share/openmpi "$ompi/share/openmpi"
cp /etc/openmpi/* "$ompi/etc/"
for f in "$ompi/bin/orterun" "$ompi"/lib/openmpi3/*.so "$ompi"/lib/pmix/*.so; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) ;;
    *) [ -f "$stage/lib/$(basename "$lib")" ] || cp -L "$lib" "$stage/lib/" ;;
  esac
done
rm -rf .gpu && mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz .
cat > .gpu/run.sh <<'RUN'
#!/bin/sh
# Unpacks the bundle into /tmp/ms-gpu once and runs its arguments with the packed programs first on the PATH.
# Each packed program is reached through a wrapper that gives it (alone) the packed libraries and CUDA's (the
# toolkit's and PyTorch's pip wheels'), so Python and PyTorch keep the machine's own libraries.
here=/tmp/ms-gpu
stamp=$(cksum <"$(dirname "$0")/bundle.tar.xz")
if [ ! -d "$here/wrap" ] || [ "$(cat "$here/stamp" 2>/dev/null)" != "$stamp" ]; then  # new or another bundle
  rm -rf "$here"
  mkdir -p "$here/wrap" && tar -C "$here" -xJf "$(dirname "$0")/bundle.tar.xz"
  echo "$stamp" >"$here/stamp"
  cudalibs=$(python3 -c "import glob, os, nvidia; d = os.path.dirname(nvidia.__path__[0]); print(':'.join(sorted(glob.glob(d + '/nvidia/**/lib', recursive=True))))" 2>/dev/null || true)
  env="export LD_LIBRARY_PATH=\"$here/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:$cudalibs\"
export QT_QPA_PLATFORM=offscreen
o=$here/ompi
export OPAL_PREFIX=\$o OPAL_EXEC_PREFIX=\$o OPAL_BINDIR=\$o/bin OPAL_LIBDIR=\$o/lib OPAL_PKGLIBDIR=\$o/lib/openmpi3
export OPAL_DATAROOTDIR=\$o/share OPAL_DATADIR=\$o/share OPAL_PKGDATADIR=\$o/share/openmpi OPAL_SYSCONFDIR=\$o/etc
export PMIX_MCA_mca_base_component_path=\$o/lib/pmix PMIX_INSTALL_PREFIX=\$o"
  for exe in "$here"/bin/* "$here/ompi/bin/orterun"; do
    name=$(basename "$exe")
    [ "$name" = orterun ] && name=mpirun
    printf '#!/bin/sh\n%s\nexec "%s" "$@"\n' "$env" "$exe" >"$here/wrap/$name"
    chmod +x "$here/wrap/$name"
  done
fi
export PATH="$here/wrap:$PATH"
exec "$@"
RUN
chmod +x .gpu/run.sh
du -sh .gpu
