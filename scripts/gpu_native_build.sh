#!/usr/bin/env bash
# Builds the native module colgraph_engine._core on a machine without a package registry (the GPU
# machine), from the Debian packages scripts/gpu_bundle.sh downloaded, without installing them:
#
#   bash scripts/gpu_native_build.sh BUNDLE_DEB_DIR PREFIX BUILD_DIR [--all-from-prefix]
#
# 1. every .deb in BUNDLE_DEB_DIR is extracted with `dpkg-deb -x` into PREFIX (never into /);
# 2. the prefix is made usable where it lies: the .pc files' prefix= points into PREFIX, igraph.pc's
#    Requires.private (libxml-2.0, needed only for static links) is dropped, and libblas.so.3 /
#    liblapack.so.3 get the links Debian's update-alternatives would make;
# 3. PREFIX/rt gets links to the carried shared libraries whose soname the system lacks (ldconfig
#    -p), so the system's own copies win wherever it has them; --all-from-prefix links every
#    carried library instead (a test on a machine that has igraph installed, to prove the prefix
#    is what gets loaded);
# 4. cmake configures the repository's CMakeLists.txt in BUILD_DIR with PREFIX's pkgconf and .pc
#    files and pybind11 from the running python3 (`python3 -m pybind11 --cmakedir`), builds _core
#    with BUILD_JOBS jobs (default: every core), with PREFIX/rt as its RPATH (DT_RPATH, so igraph's own dependencies are found
#    there too, without LD_LIBRARY_PATH);
# 5. imports it by its path and says where libigraph was loaded from; the last line printed is the .so.
#
# Nothing in the source tree is written. PYTHON (default python3) picks the interpreter.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BUNDLE_DEB_DIR PREFIX BUILD_DIR [--all-from-prefix]" >&2; exit 2; }
DEBS=$(cd "$1" && pwd)
PREFIX=$2
BUILD=$3
ALL=${4:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
ARCH=x86_64-linux-gnu
t0=$(date +%s)

mkdir -p "$PREFIX" "$BUILD"
PREFIX=$(cd "$PREFIX" && pwd)
BUILD=$(cd "$BUILD" && pwd)
for f in "$DEBS"/*.deb; do
    dpkg-deb -x "$f" "$PREFIX"
done
LIB=$PREFIX/usr/lib/$ARCH
for pc in "$LIB"/pkgconfig/*.pc; do
    sed -i -e "s|^prefix=/usr\$|prefix=$PREFIX/usr|" -e "s|^exec_prefix=/usr\$|exec_prefix=$PREFIX/usr|" \
        -e '/^Requires.private:/d' "$pc"
done
[ -e "$LIB/libblas.so.3" ] || ln -s blas/libblas.so.3 "$LIB/libblas.so.3"
[ -e "$LIB/liblapack.so.3" ] || ln -s lapack/liblapack.so.3 "$LIB/liblapack.so.3"

# The runtime directory: carried sonames the system lacks (all of them with --all-from-prefix).
RT=$PREFIX/rt
rm -rf "$RT"
mkdir -p "$RT"
system=$(ldconfig -p 2>/dev/null | awk '{print $1}' | sort -u)
carried=0
for so in $(cd "$LIB" && ls | grep -E '\.so\.[0-9]+$' || true); do
    if [ "$ALL" = "--all-from-prefix" ] || ! grep -qxF "$so" <<<"$system"; then
        ln -s "$LIB/$so" "$RT/$so"
        carried=$((carried + 1))
    fi
done
echo "gpu_native_build.sh: $carried carried libraries in $RT: $(ls "$RT" | tr '\n' ' ')"

# pkgconf from the prefix (the device may have no pkg-config); it needs its own libpkgconf.
PKGCONF=$PREFIX/usr/bin/pkgconf
cat > "$PREFIX/pkg-config" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$PKGCONF" "\$@"
EOF
chmod +x "$PREFIX/pkg-config"
export PKG_CONFIG_PATH=$LIB/pkgconfig
export PKG_CONFIG_LIBDIR=$LIB/pkgconfig  # only the prefix's .pc files, never the system's
echo "gpu_native_build.sh: igraph $("$PREFIX/pkg-config" --modversion igraph): $("$PREFIX/pkg-config" --cflags --libs igraph)"

PYBIND11_DIR=$("$PY" -m pybind11 --cmakedir)
# cmake and ninja: on PATH, else from the interpreter's pip packages of those names (the device
# has both as Python packages; make may be absent there)
CMAKE=$(command -v cmake || "$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
NINJA=$(command -v ninja || "$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || true)
GEN=()
[ -n "$NINJA" ] && [ -x "$NINJA" ] && GEN=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA")
echo "gpu_native_build.sh: $("$CMAKE" --version | head -1), generator ${GEN[*]:-Unix Makefiles}, pybind11 $PYBIND11_DIR"
"$CMAKE" -S "$REPO" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$PYBIND11_DIR" \
    -DPKG_CONFIG_EXECUTABLE="$PREFIX/pkg-config" \
    -DCMAKE_SKIP_BUILD_RPATH=ON \
    -DCMAKE_SHARED_LINKER_FLAGS="-Wl,--disable-new-dtags,-rpath,$RT -Wl,-rpath-link,$LIB" \
    -DCMAKE_MODULE_LINKER_FLAGS="-Wl,--disable-new-dtags,-rpath,$RT -Wl,-rpath-link,$LIB" > "$BUILD/configure.log"
"$CMAKE" --build "$BUILD" -j "${BUILD_JOBS:-$(nproc)}" > "$BUILD/build.log"
SO=$(ls "$BUILD"/_core*.so | head -1)
echo "gpu_native_build.sh: built $SO in $(( $(date +%s) - t0 )) s"

# Import it by its path (an installed colgraph_engine elsewhere on the path cannot stand in for it),
# and say where libigraph was loaded from.
"$PY" - "$SO" "$RT" <<'EOF'
import importlib.util
import sys
so, rt = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("colgraph_engine._core", so)
core = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core)
maps = [line.split()[-1] for line in open("/proc/self/maps").read().splitlines() if "libigraph" in line]
if not maps:
    sys.exit("gpu_native_build.sh: the module imported but no libigraph is mapped")
import os
carried = os.path.realpath(os.path.join(rt, "libigraph.so.3"))
print("gpu_native_build.sh: import ok:", so, "| libigraph loaded from", maps[0],
      "| the carried one:", os.path.exists(carried) and os.path.realpath(maps[0]) == carried)
EOF
echo "$SO"
