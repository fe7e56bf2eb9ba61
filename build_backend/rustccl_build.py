"""PEP 517 backend of rustccl: maturin's, after a check that the building
Python has the torch that pyproject.toml pins.

rustccl's C++ shim is compiled against one torch's headers and C++ ABI, and
the wheel requires exactly that torch, so it is built against the torch the
user already has (`pip install --no-build-isolation .`). Under pip's default
build isolation the building Python cannot see that torch; rather than
failing minutes into a Rust build (or downloading a second ~5 GB torch into
a throw-away build environment), the wheel hooks stop at once and say so.
sdists need no torch.
"""

from __future__ import annotations

import os
import re

import maturin
from maturin import build_sdist, get_requires_for_build_sdist  # noqa: F401  (re-exported hooks)

_HERE = os.path.dirname(os.path.abspath(__file__))


def _pinned_torch() -> str:
    with open(os.path.join(_HERE, "..", "pyproject.toml"), encoding="utf-8") as f:
        pins = sorted(set(re.findall(r'"torch==([^"\s;]+)', f.read())))
    if len(pins) != 1:
        raise RuntimeError(f"rustccl build: pyproject.toml must pin one torch version, found {pins}")
    return pins[0]


def check_torch() -> None:
    """Raises with a message when the building Python lacks the pinned torch."""
    from importlib import metadata

    pin = _pinned_torch()
    try:
        found = metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise SystemExit(
            f"rustccl build: the building Python has no torch (pip's default build isolation hides the installed one).\n"
            f"rustccl compiles its C++ shim against the installed torch=={pin}, and the wheel requires exactly that "
            f"torch, so it builds only against it. Install torch=={pin} and build with\n"
            f"    pip install --no-build-isolation .\n"
            f"(see README.md, 'Install into your own environment')."
        ) from None
    if found.split("+")[0] != pin:
        raise SystemExit(
            f"rustccl build: the building Python has torch {found}, but this rustccl pins torch=={pin}.\n"
            f"Install torch=={pin}, or change every torch== pin in pyproject.toml to build for torch {found}."
        )


def get_requires_for_build_wheel(config_settings=None):
    check_torch()
    return maturin.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    check_torch()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    check_torch()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    check_torch()
    return maturin.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    check_torch()
    return maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    check_torch()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
