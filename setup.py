"""Which packages the wheel holds (the project's metadata is in pyproject.toml).

Discovered, never listed: every package under ``libs/common``, ``cli`` and each ``services/<name>``
whose name starts with ``agmarl_``, subpackages included, so a new subpackage or service ships without an
edit here. The model folders under ``models/`` (``default`` and the experts that ``model:<name>`` loads)
ship as package data of ``agmarl_models``; ``agmarl_common.serving.modelstore`` reads them from there when it runs
from an installed wheel rather than a source checkout.
"""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
ROOTS = ["libs/common", "cli", *sorted(p.relative_to(HERE).as_posix() for p in (HERE / "services").iterdir()
                                         if p.is_dir())]
MODEL_FILES = ["*/*"]  # every file of every folder under models/ (each model, its manifest and signature)


def discover() -> tuple[list[str], dict[str, str]]:
    """(packages, package_dir) for every ``agmarl_*`` package under ``ROOTS``."""
    packages, package_dir = [], {}
    for root in ROOTS:
        for pkg in find_packages(str(HERE / root), include=["agmarl_*"]):
            if pkg in package_dir:
                raise SystemExit(f"setup.py: package {pkg} found twice ({package_dir[pkg]}, {root})")
            packages.append(pkg)
            package_dir[pkg] = f"{root}/{pkg.replace('.', '/')}"
    return packages, package_dir


packages, package_dir = discover()
# include_package_data off: the package data is exactly MODEL_FILES (the model folders are data, not packages)
setup(packages=[*packages, "agmarl_models"], package_dir={**package_dir, "agmarl_models": "models"},
      package_data={"agmarl_models": MODEL_FILES}, include_package_data=False)
