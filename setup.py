"""Package discovery for setuptools: every package under ``prefect_odm/`` found from the tree, and
``flows/``, ``tasks/`` and ``blocks/`` (at the repository root, as the design card asks) installed
inside the ``prefect_odm`` namespace, so they never collide with a user's own ``flows`` package.

Everything else about the project is in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

MAPPED = ("flows", "tasks", "blocks")
"""Root folders installed as ``prefect_odm.<name>``."""

packages = find_packages(include=["prefect_odm", "prefect_odm.*"])
package_dir = {"prefect_odm": "prefect_odm"}
for root in MAPPED:
    for sub in ["", *find_packages(where=root)]:
        name = f"prefect_odm.{root}" + (f".{sub}" if sub else "")
        packages.append(name)
        package_dir[name] = root + ("/" + sub.replace(".", "/") if sub else "")

setup(packages=packages, package_dir=package_dir)
