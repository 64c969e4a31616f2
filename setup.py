"""The wheel's packages, found by setuptools' discovery rather than listed by hand (a hand list is how a package
goes missing from the wheel while editable installs hide it).

The design keeps parts of the package in top-level folders (``kernels/``, ``integrations/``, ``eval/``,
``training/``), each installed as a subpackage of ``hypic_rag``. ``pyproject.toml``'s static configuration can
map such a folder or run discovery, not both, so the two meet here; everything else stays in ``pyproject.toml``.
"""

from setuptools import find_namespace_packages, setup

# Top-level folders installed as ``hypic_rag.<folder>``.
SUBPACKAGE_FOLDERS = ("kernels", "integrations", "eval", "training")
# Namespace discovery also takes the folders that hold only data (the bundled model), so they ship as the
# packages they look like; byte-code caches are not packages.
NOT_PACKAGES = ("__pycache__", "*.__pycache__")


def packages() -> tuple[list[str], dict[str, str]]:
    found = ["hypic_rag", *(f"hypic_rag.{p}" for p in find_namespace_packages("hypic_rag", exclude=NOT_PACKAGES))]
    folders = {}
    for folder in SUBPACKAGE_FOLDERS:
        name = f"hypic_rag.{folder}"
        folders[name] = folder
        found += [name, *(f"{name}.{p}" for p in find_namespace_packages(folder, exclude=NOT_PACKAGES))]
    return found, folders


found, folders = packages()
setup(packages=found, package_dir=folders)
