#!/usr/bin/env python3
"""Install a host stack (e.g. PyMC), then ptnative, into one virtual environment, and fail if installing ptnative
moved any package of the host down, replaced it by another version or removed it, or left ``pip check`` unhappy.

    python scripts/check_no_downgrade.py --venv /work/envs/m-py312-pymc6 --python python3.12 \
        --host "pymc==6.4.*" --install ".[test]"

The venv is created with ``--python`` when it does not exist.  ``--host`` and ``--install`` take pip requirement
arguments (repeatable).  Writes ``host-versions.txt`` and ``after-versions.txt`` in the venv.  Exit status 0 when
nothing of the host changed; 1 (with the list of changes) otherwise; pip's own status when an install fails.
Runs with any Python >= 3.8 and nothing but the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def pip(venv_python: str, *args: str) -> None:
    cmd = [venv_python, "-m", "pip", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        sys.exit(proc.returncode)


def installed(venv_python: str) -> dict[str, str]:
    out = subprocess.run([venv_python, "-m", "pip", "--disable-pip-version-check", "list", "--format=json"],
                         check=True, capture_output=True, text=True).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


def write_versions(path: str, versions: dict[str, str]) -> None:
    with open(path, "w") as f:
        f.writelines(f"{name}=={version}\n" for name, version in sorted(versions.items()))


def changes(before: dict[str, str], after: dict[str, str], ignore: set[str]) -> list[str]:
    """Every package of ``before`` that ``after`` lacks or has at another version (up or down: a replaced
    version breaks a host that pinned it just as a downgrade does)."""
    found = []
    for name, version in sorted(before.items()):
        if name in ignore:
            continue
        if name not in after:
            found.append(f"{name} {version} was removed")
        elif after[name] != version:
            found.append(f"{name} {version} -> {after[name]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", required=True, help="the virtual environment (created when missing)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that creates the venv")
    parser.add_argument("--host", action="append", default=[], help="the host stack's requirements (pip args)")
    parser.add_argument("--install", action="append", default=[], help="what to install afterwards (pip args)")
    args = parser.parse_args(argv)

    venv_python = os.path.join(args.venv, "bin", "python")
    if not os.path.exists(venv_python):
        subprocess.run([args.python, "-m", "venv", args.venv], check=True)
        pip(venv_python, "install", "--quiet", "--upgrade", "pip")
    if args.host:
        pip(venv_python, "install", "--quiet", *args.host)
    before = installed(venv_python)
    write_versions(os.path.join(args.venv, "host-versions.txt"), before)
    pip(venv_python, "install", "--quiet", *args.install)
    after = installed(venv_python)
    write_versions(os.path.join(args.venv, "after-versions.txt"), after)

    # ptnative itself may be reinstalled (a new build of the checkout); everything else must stay as it was.
    moved = changes(before, after, ignore={"ptnative", "pip"})
    check = subprocess.run([venv_python, "-m", "pip", "--disable-pip-version-check", "check"], capture_output=True,
                           text=True)
    added = sorted(set(after) - set(before))
    print(f"host: {len(before)} packages; added by the install: {', '.join(added) or 'none'}")
    if moved:
        print("FAIL: installing " + " ".join(args.install) + " changed the host's packages:\n  " + "\n  ".join(moved))
    if check.returncode != 0:
        print("FAIL: pip check:\n" + check.stdout + check.stderr)
    if moved or check.returncode != 0:
        return 1
    print("OK: nothing of the host moved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
