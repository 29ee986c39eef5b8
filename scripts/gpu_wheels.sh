#!/usr/bin/env bash
# Download, HERE (it needs the network), the Python 3.12 wheels that the GPU machine lacks into .whl/, for
# scripts/gpu_check.sh to install THERE (no network there).  See docs/gpu.md.
#
#   scripts/gpu_wheels.sh              pytensor 3.0.7 + its pure deps, and numba 0.65.1 / llvmlite / numpy 2.4
#   scripts/gpu_wheels.sh --no-numba   only pytensor and its pure deps (about 2 MiB), for a machine whose own
#                                      numba works with pytensor 3.0.7
#
# The wheels travel with the working tree (64 MiB limit for all of it), so the big ones are recompressed: each
# member re-deflated with LZMA (pip installs such wheels: Python's zipfile reads them), and llvmlite's
# libllvmlite.so stripped of its static symbol table (strip --strip-unneeded; RECORD updated).  Contents are
# otherwise unchanged.  Idempotent: a wheel already in .whl/ is kept; wheels of other versions are removed.
# Environment: PYTHON (default python3, needs pip), PTNATIVE_WHEEL_CACHE (raw downloads, default
# ~/.cache/ptnative/gpu-wheels), WHEEL_LIMIT_MIB (default 60: fail above it).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
DEST=.whl
RAW=${PTNATIVE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ptnative/gpu-wheels}
LIMIT_MIB=${WHEEL_LIMIT_MIB:-60}

# pytensor 3.0.7's Requires-Dist: setuptools, scipy, numpy>=2.0, numba>=0.58,<=0.65.1, filelock, etuples,
# logical-unification, miniKanren, cons.  Theirs: cons -> logical-unification; etuples -> cons, multipledispatch;
# logical-unification -> toolz, multipledispatch; miniKanren -> cons, etuples, logical-unification,
# multipledispatch, toolz, typing_extensions.  The GPU image has setuptools, scipy, filelock, multipledispatch,
# toolz and typing-extensions.  numba 0.65.1 wants llvmlite 0.47.x and numpy >=1.22,<2.5 (the image has 2.5).
PINS=(pytensor==3.0.7 etuples==0.3.10 logical-unification==0.4.7 miniKanren==1.0.5 cons==0.4.7)
case "${1:-}" in
    "") PINS+=(numba==0.65.1 llvmlite==0.47.0 numpy==2.4.6) ;;
    --no-numba) ;;
    *) echo "usage: $0 [--no-numba]" >&2; exit 2 ;;
esac

mkdir -p "$DEST" "$RAW"
"$PY" - "$DEST" "$RAW" "$LIMIT_MIB" "${PINS[@]}" <<'PYEOF'
import base64, hashlib, os, re, shutil, subprocess, sys, tempfile, zipfile

dest, raw, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
pins = [p.split("==") for p in sys.argv[4:]]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def find(folder, name, version):
    """The wheel of name==version in folder, or None."""
    for f in sorted(os.listdir(folder)):
        parts = f[:-4].split("-") if f.endswith(".whl") else []
        if len(parts) >= 5 and norm(parts[0]) == norm(name) and parts[1] == version:
            return os.path.join(folder, f)
    return None


def download(name, version):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", raw,
           f"{name}=={version}"]
    subprocess.run(cmd, check=True)
    path = find(raw, name, version)
    if path is None:
        sys.exit(f"pip downloaded no wheel for {name}=={version}")
    return path


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def strip(data):
    if not shutil.which("strip"):
        return data
    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as tmp:
        tmp.write(data)
    try:
        subprocess.run(["strip", "--strip-unneeded", tmp.name], check=True)
        with open(tmp.name, "rb") as f:
            return f.read()
    finally:
        os.unlink(tmp.name)


def repack(src, dst):
    """src re-written with LZMA members; libllvmlite.so stripped (its RECORD line updated)."""
    tmp = dst + ".part"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_LZMA) as zout:
        changed, members = {}, []
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/libllvmlite.so"):
                stripped = strip(data)
                if stripped != data:
                    changed[info.filename] = record_line(info.filename, stripped)
                data = stripped
            members.append((info, data))
        for info, data in members:
            if changed and info.filename.endswith(".dist-info/RECORD"):
                lines = [changed.get(line.split(",")[0], line) for line in data.decode().splitlines()]
                data = ("\n".join(lines) + "\n").encode()
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr = info.external_attr
            out.compress_type = zipfile.ZIP_LZMA
            zout.writestr(out, data)
    os.replace(tmp, dst)


wanted = set()
for name, version in pins:
    have = find(dest, name, version)
    if have is not None:
        with zipfile.ZipFile(have) as z:
            if all(i.compress_type == zipfile.ZIP_LZMA for i in z.infolist()):
                wanted.add(os.path.basename(have))
                continue
    src = find(raw, name, version) or download(name, version)
    out = os.path.join(dest, os.path.basename(src))
    print(f"repacking {os.path.basename(src)} ({os.path.getsize(src) / 2**20:.1f} MiB) ...", flush=True)
    repack(src, out)
    wanted.add(os.path.basename(out))
for f in sorted(os.listdir(dest)):
    if f not in wanted:
        print(f"removing {f} (not pinned)")
        os.unlink(os.path.join(dest, f))
total = 0
for f in sorted(wanted):
    size = os.path.getsize(os.path.join(dest, f))
    total += size
    print(f"  {size / 2**20:7.2f} MiB  {f}")
print(f"  {total / 2**20:7.2f} MiB  total in {dest}/ ({len(wanted)} wheels; limit {limit:g} MiB)")
if total > limit * 2**20:
    sys.exit(f"{dest}/ holds {total / 2**20:.1f} MiB, over {limit:g} MiB")
PYEOF
