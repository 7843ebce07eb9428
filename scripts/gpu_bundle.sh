#!/usr/bin/env bash
# Downloads, on a machine with a package registry, everything the GPU machine (no registry) needs
# for benchmarks/gpu_all.sh, into one git-ignored folder that a device `run` carries:
#
#   gpu_bundle/whl/   the peers' wheels (late-interaction-kernels, colpali-engine, fast-plaid and its
#                     needs) and pybind11, for CPython 3.12 on x86-64 manylinux (the device's Python);
#                     torch, triton, transformers, peft, scipy... are already on the device
#   gpu_bundle/deb/   Debian bookworm's igraph (libigraph3, libigraph-dev) and the libraries it needs,
#                     plus pkgconf: gpu_native_build.sh extracts them with `dpkg-deb -x` into a prefix
#                     (never installed with apt) and builds colgraph_engine._core against it
#   gpu_bundle/MANIFEST.txt   file, package version, bytes, sha256; and the total
#
#   bash scripts/gpu_bundle.sh [DIR]        # DIR defaults to gpu_bundle/ in the repository root
#
# Bookworm's builds need glibc >= 2.36, so they run on the device's newer system (its Python is
# 3.12.3, Ubuntu 24.04's, glibc 2.39). libc6, libgcc-s1, libstdc++6 are not carried: any machine
# with the C++ compiler the build uses has them. Re-running skips files already there.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-gpu_bundle}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$DIR/whl" "$DIR/deb"

# Wheels: the versions ../shared/bench/README.md measured the peers with.
WHEELS=(late-interaction-kernels==0.4.5 colpali-engine==0.3.18 fast-plaid==1.7.0.2110 fastkmeans==0.5.0
        usearch==2.26.6 numkong==7.8.6 pybind11==3.0.1)
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
    -d "$DIR/whl" "${WHEELS[@]}" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
for w in "${WHEELS[@]}"; do  # pip download says little when a name is missing: check each one arrived
    n=${w%%==*}; n=${n//-/_}
    compgen -G "$DIR/whl/${n}-*.whl" > /dev/null || { echo "gpu_bundle.sh: missing wheel $w" >&2; exit 1; }
done

# Debian packages: igraph, what it links (apt-cache depends, closed by hand), pkgconf for CMake's
# pkg_check_modules. The BLAS/LAPACK builds are the reference ones (libblas3, liblapack3).
DEBS=(libigraph3 libigraph-dev libarpack2 libblas3 liblapack3 libglpk40 libplfit0 libgmp10 libxml2 libicu72
      libgfortran5 libquadmath0 libgomp1 libamd2 libcolamd2 libsuitesparseconfig5 libltdl7 zlib1g liblzma5
      pkgconf-bin libpkgconf3)
have_lists=$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' 2>/dev/null | head -1)
[ -n "$have_lists" ] || apt-get update -qq
missing=()
for p in "${DEBS[@]}"; do
    [ -f "$DIR/deb/$p.deb" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -q "${missing[@]}" 2>&1 | grep -v "Download is performed unsandboxed" || true)
    # plain names (apt's carry '%3a', '+', '~'); the version stays in the package and the manifest
    for p in "${missing[@]}"; do
        f=$(compgen -G "$tmp/${p}_*.deb") || { echo "gpu_bundle.sh: apt-get download gave no $p" >&2; exit 1; }
        mv "$f" "$DIR/deb/$p.deb"
    done
    rm -rf "$tmp"
fi

# Manifest, and the weight of what a run carries.
(
    cd "$DIR"
    find whl deb -type f | sort | while read -r f; do
        v=""
        case "$f" in *.deb) v=$(dpkg-deb -f "$f" Version) ;; esac
        printf '%s\t%s\t%s\t%s\n' "$f" "$v" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
    done
) > "$DIR/MANIFEST.txt.tmp"
total=$(awk -F'\t' '{s += $3} END {print s}' "$DIR/MANIFEST.txt.tmp")
printf 'total\t\t%s\n' "$total" >> "$DIR/MANIFEST.txt.tmp"
mv "$DIR/MANIFEST.txt.tmp" "$DIR/MANIFEST.txt"
awk -v t="$total" 'BEGIN {printf "gpu_bundle.sh: %s holds %.1f MiB (the device carries at most 64 MiB with the tree)\n", "'"$DIR"'", t / 1048576}'
