#!/usr/bin/env python3
"""Whether the interpreter that runs this has exactly the versions a constraints file pins.

Usage: .venv/bin/python .ci/check-lock.py constraints.txt [name==version ...]

Compares the installed packages (`pip list --format=freeze`: pip freeze's list, with a version also for a package
installed from a file or URL) with every `name==version` line of the file and the pins given after it (the
Makefile's TORCH; a bare name only has to be installed), and exits 1 on any package missing or at another version.
A pin without a local label (torch==2.13.0) matches a build with one (2.13.0+cpu), as it does for pip. Installed
packages the file does not list are named, not failed: elsewhere torch may bring packages of its own (CUDA's).
"""

import re
import subprocess
import sys


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines):
    found = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = (part.strip() for part in line.partition("=="))
        found[canonical(name)] = (name, version)  # no version (TORCH=torch): only whether it is installed
    return found


def matches(pinned: str, installed: str) -> bool:
    if "+" not in pinned:
        installed = installed.split("+", 1)[0]
    return pinned == installed


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path, extra = sys.argv[1], sys.argv[2:]
    with open(path, encoding="utf-8") as f:
        wanted = pins(f)
    wanted.update(pins(extra))
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {}
    for line in freeze.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            installed[canonical(name.strip())] = version.strip()
    wrong = []
    for key, (name, version) in sorted(wanted.items()):
        if key not in installed:
            wrong.append(f"  {name}=={version}: not installed")
        elif version and not matches(version, installed[key]):
            wrong.append(f"  {name}=={version}: installed {installed[key]}")
    unlisted = sorted(set(installed) - set(wanted) - {"pip", "setuptools", "wheel", "uv"})
    if unlisted:
        print(f"check-lock: installed but not in {path}: {', '.join(unlisted)}")
    if wrong:
        print(f"check-lock: {len(wrong)} of {len(wanted)} packages differ from {path} (make install, or make lock):")
        print("\n".join(wrong))
        return 1
    print(f"check-lock: all {len(wanted)} packages pinned by {path} are installed at those versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
