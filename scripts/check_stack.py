"""Fail if installing xlakit moved a version a stack's requirements file pins.

`make` installs a stack's pins first and xlakit with its dependencies after:
on Colab, `%pip install xlakit` must leave torch, jax and ipywidgets as they came.
"""
import re
import sys
from importlib import metadata


def pins(path: str) -> dict[str, str]:
    found = {}
    for line in open(path):
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s#]+)", line.split("#")[0].strip())
        if match:
            found[match[1]] = match[2]
    return found


def main(path: str) -> None:
    moved = [f"{name}: pinned {want}, installed {metadata.version(name)}"
             for name, want in pins(path).items() if metadata.version(name).split("+")[0] != want]
    if moved:
        sys.exit(f"installing xlakit moved versions {path} pins:\n  " + "\n  ".join(moved))
    print(f"{path}: every pin kept ({len(pins(path))})")


if __name__ == "__main__":
    main(sys.argv[1])
