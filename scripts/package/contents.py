"""Compare a built sdist and wheel with the checkout they were built from.

    python contents.py CHECKOUT SDIST WHEEL

The project's files are what git sees in CHECKOUT (tracked, or untracked but not ignored), so
whatever .gitignore calls junk (venvs, databases, bytecode, build output) counts as junk here.
The sdist must hold exactly the project files under SDIST_ROOTS plus SDIST_FILES, and the
metadata the build writes; the wheel exactly the files under django_periodic/ and its
.dist-info. Missing and unexpected files are listed, and the exit status is 1 if there are any.
"""

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path

# What the sdist carries from the checkout (setuptools' defaults and MANIFEST.in).
SDIST_ROOTS = ("django_periodic/", "docs/", "tests/", "example_project/")
SDIST_FILES = {"LICENSE", "README.md", "CHANGELOG.md", "MANIFEST.in", "pyproject.toml"}
# What the build writes into the sdist itself.
SDIST_GENERATED = {"PKG-INFO", "setup.cfg"}
SDIST_GENERATED_ROOTS = ("django_periodic.egg-info/",)

WHEEL_ROOT = "django_periodic/"
# Metadata in a wheel's .dist-info that must be there (RECORD and the rest are the build's).
WHEEL_METADATA = {"METADATA", "WHEEL", "RECORD", "licenses/LICENSE"}


def project_files(checkout: Path) -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=checkout,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # A tracked file deleted in the work tree is not built, so not expected either.
    return {name for name in listed.split("\0") if name and (checkout / name).is_file()}


def compare(what: str, shipped: set[str], expected: set[str], allowed: set[str]) -> list[str]:
    problems = [f"{what}: missing {name}" for name in sorted(expected - shipped)]
    problems += [f"{what}: unexpected {name}" for name in sorted(shipped - expected - allowed)]
    return problems


def check_sdist(path: Path, files: set[str]) -> list[str]:
    with tarfile.open(path) as archive:
        members = [m.name for m in archive.getmembers() if m.isfile()]
    prefix = members[0].split("/", 1)[0] + "/"  # django_periodic-X.Y.Z/
    shipped = {name.removeprefix(prefix) for name in members}
    expected = {name for name in files if name.startswith(SDIST_ROOTS) or name in SDIST_FILES}
    generated = {name for name in shipped if name.startswith(SDIST_GENERATED_ROOTS)}
    return compare("sdist", shipped, expected, SDIST_GENERATED | generated)


def check_wheel(path: Path, files: set[str], project: dict) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        shipped = {name for name in archive.namelist() if not name.endswith("/")}
        dist_info = next(n.split("/", 1)[0] for n in shipped if ".dist-info/" in n) + "/"
        metadata = HeaderParser().parsestr(archive.read(dist_info + "METADATA").decode())
    expected = {name for name in files if name.startswith(WHEEL_ROOT)}
    expected |= {dist_info + name for name in WHEEL_METADATA}
    allowed = {name for name in shipped if name.startswith(dist_info)}
    problems = compare("wheel", shipped, expected, allowed)

    # The metadata PyPI shows and pip resolves with, read back from the wheel.
    wanted = {
        "Name": [project["name"]],
        "Version": [project["version"]],
        "License-Expression": [project["license"]],
        "Requires-Python": [project["requires-python"]],
        "Provides-Extra": sorted(project["optional-dependencies"]),
    }
    for field, values in wanted.items():
        got = sorted(metadata.get_all(field) or [])
        if got != sorted(values):
            problems.append(f"wheel: METADATA {field} is {got}, pyproject.toml says {values}")
    return problems


def main() -> int:
    checkout, sdist, wheel = (Path(arg) for arg in sys.argv[1:4])
    files = project_files(checkout)
    project = tomllib.loads((checkout / "pyproject.toml").read_text())["project"]
    problems = check_sdist(sdist, files) + check_wheel(wheel, files, project)
    for problem in problems:
        print(f"  {problem}")
    if problems:
        return 1
    print(f"  contents: {sdist.name} and {wheel.name} hold what they should, nothing else")
    return 0


if __name__ == "__main__":
    sys.exit(main())
