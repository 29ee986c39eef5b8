#!/usr/bin/env bash
# The GPU check, as ONE command on a fresh GPU machine (no network, Python 3.12; see docs/gpu.md):
#
#   scripts/gpu_check.sh [REPORT]        (REPORT: default $OUT/gpu_report.txt when $OUT is set, else gpu_report.txt)
#
# Stages, each under `timeout` so that the whole stays under GPU_CHECK_BUDGET_S (default 460 s) and a hang in one
# stage still leaves a report:
#   setup  install .whl/ (from scripts/gpu_wheels.sh) into temporary --target folders put first on PYTHONPATH,
#          and the checkout after it (ptnative runs from source); see "numba" below
#   info   python -m ptnative info
#   build  python -m ptnative build --device cuda -j N  and  --device cpu -j N, concurrently, into a fresh
#          PTNATIVE_CACHE_DIR (or the one given), PTNATIVE_CUDA_ARCHS from the GPU (N: GPU_CHECK_JOBS or nproc)
#   tests  pytest -q -p no:cacheprovider tests/gpu  (--timeout from pytest-timeout when it is there;
#          GPU_CHECK_PYTEST_ARGS appended; unset: "-n 8" (at most nproc) when pytest-xdist is installed)
#   bench  python bench/gpu.py (with PTNATIVE_COUNT_DEVICE_WORK=1, as every stage: the CUDA libraries count their
#          launches, allocations and copies, and the benchmark prints them per call)
# Everything is written to REPORT and to stdout; the report ends with a table of the stages (status, seconds).
# Exit status: 0 when every stage passed (or was skipped for want of a GPU), 1 otherwise.
#
# numba: pytensor 3.0.7 wants numba <= 0.65.1, which wants numpy < 2.5; the GPU image has numpy 2.5 and a newer
# numba, which its torch, jax and cupy were installed with.  pytensor and its pure dependencies go into one folder,
# numba 0.65.1 / llvmlite / numpy 2.4 into another.  The stack CI tests (both folders first on PYTHONPATH) is
# preferred, so that a failure here is about the GPU and not about an untested numba; a probe checks it: pytensor's
# default (Numba) mode compiles and runs a small function, and scipy, torch and jax (where installed) import and
# take numpy arrays.  If that fails (say, the image's jax refused numpy 2.4) the machine's own numba / numpy are
# probed and used instead.  GPU_CHECK_NUMBA=wheels: the wheels' only; GPU_CHECK_NUMBA=machine: the machine's only.
#
# Without a GPU (as on a developer's machine, with PYTHON=/path/to/venv/bin/python) the GPU stages say
# "no GPU, skipped" and the rest runs: that is how this script is tested.
# Environment: PYTHON (default python3), PTNATIVE_CACHE_DIR, PTNATIVE_CUDA_ARCHS, GPU_CHECK_BUDGET_S,
# GPU_CHECK_JOBS, GPU_CHECK_NUMBA, GPU_CHECK_PYTEST_ARGS, GPU_CHECK_TEST_TIMEOUT_S (per test, default 120),
# PTNATIVE_COUNT_DEVICE_WORK (default 1; 0: libraries that count nothing).
set -uo pipefail
if [[ $# -gt 0 ]]; then REPORT=$1
elif [[ -n "${OUT:-}" ]]; then REPORT=$OUT/gpu_report.txt
else REPORT=gpu_report.txt
fi
mkdir -p "$(dirname "$REPORT")" && : > "$REPORT" || { echo "cannot write $REPORT" >&2; exit 1; }
REPORT=$(cd "$(dirname "$REPORT")" && pwd)/$(basename "$REPORT")  # relative to the caller's directory
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-460}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
# what each stage leaves for the ones after it (of 460 s: 322 after setup, 299 after info, 184 after the build,
# 147 after the tests)
R_SETUP=$((BUDGET * 70 / 100)) R_INFO=$((BUDGET * 65 / 100))
R_BUILD=$((BUDGET * 40 / 100)) R_TESTS=$((BUDGET * 32 / 100))
JOBS=${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}
WORK=$(mktemp -d /tmp/ptnative-gpu-check.XXXXXX)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# CUDA libraries that count their launches, allocations and copies (docs/gpu.md): the benchmark prints them per call
export PTNATIVE_COUNT_DEVICE_WORK=${PTNATIVE_COUNT_DEVICE_WORK:-1}

ST_NAME=() ST_STATUS=() ST_SECS=()
FAILED=0

log() { printf '%s\n' "$*" | tee -a "$REPORT"; }
section() { log ""; log "== $* =="; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
record() {  # name status seconds
    ST_NAME+=("$1") ST_STATUS+=("$2") ST_SECS+=("$3")
    case $2 in ok*|skipped*) ;; *) FAILED=1 ;; esac
}
limit() {  # cap reserve: seconds for a stage, leaving `reserve` for the stages after it
    local left=$((DEADLINE - $(date +%s) - $2))
    if ((left < $1)); then echo $((left > 1 ? left : 1)); else echo "$1"; fi  # never 0: timeout 0 = none
}
status_of() {  # rc limit
    case $1 in
        0) echo ok ;;
        124|137) echo "TIMEOUT after $2 s" ;;
        *) echo "FAILED (exit $1)" ;;
    esac
}
run_stage() {  # name cap reserve command...: run under timeout, output into the report
    local name=$1 cap=$2 reserve=$3 t t0 rc
    shift 3
    t=$(limit "$cap" "$reserve")
    section "$name (limit $t s): $*"
    if ((t < 5)); then log "no time left, skipped"; record "$name" "NOT RUN (no time left)" 0; return 1; fi
    t0=$(now)
    timeout -k 10 "$t" "$@" 2>&1 | tee -a "$REPORT"
    rc=${PIPESTATUS[0]}
    record "$name" "$(status_of "$rc" "$t")" "$(since "$t0")"
    return "$rc"
}

# ------------------------------------------------------------------ header
log "ptnative GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), budget $BUDGET s"
log "checkout: $ROOT ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo 'no git metadata'))"
log "python: $PY = $(command -v "$PY") ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
GPU_LINE=""
if command -v nvidia-smi >/dev/null 2>&1; then
    GPU_LINE=$(timeout 30 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total \
        --format=csv,noheader 2>/dev/null | head -1)
fi
if [[ -n "$GPU_LINE" ]]; then
    HAVE_GPU=1
    log "GPU: $GPU_LINE"
    if [[ -z "${PTNATIVE_CUDA_ARCHS:-}" ]]; then
        PTNATIVE_CUDA_ARCHS=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d ' .' \
            | sort -u | paste -sd ';')
        export PTNATIVE_CUDA_ARCHS
    fi
else
    HAVE_GPU=0
    log "GPU: none found (nvidia-smi missing or silent): the GPU stages are skipped"
fi
if [[ -z "${PTNATIVE_CACHE_DIR:-}" ]]; then
    PTNATIVE_CACHE_DIR=$WORK/cache
fi
export PTNATIVE_CACHE_DIR
log "PTNATIVE_CACHE_DIR=$PTNATIVE_CACHE_DIR  PTNATIVE_CUDA_ARCHS=${PTNATIVE_CUDA_ARCHS:-(default)}  jobs=$JOBS"

# ------------------------------------------------------------------ setup
cat > "$WORK/probe.py" <<'PYEOF'
# pytensor's default (Numba) mode works, and the peers that are installed still import and use numpy
import importlib.util, os, time
t = time.time()
import numpy, numba, llvmlite, pytensor, pytensor.tensor as pt
x = pt.dvector("x")
f = pytensor.function([x], (pt.exp(x) * 2).sum())
assert abs(f(numpy.zeros(3)) - 6) < 1e-12
import scipy.special
assert scipy.special.expit(numpy.zeros(2)).sum() == 1
if importlib.util.find_spec("torch"):
    import torch
    assert float(torch.from_numpy(numpy.ones(3)).sum()) == 3
if importlib.util.find_spec("jax"):
    import jax.numpy as jnp
    assert float(jnp.asarray(numpy.ones(3)).sum()) == 3
where = lambda m: os.path.dirname(os.path.dirname(m.__file__))
print(f"probe ok ({time.time() - t:.1f} s): pytensor {pytensor.__version__}, numba {numba.__version__}, "
      f"llvmlite {llvmlite.__version__}, numpy {numpy.__version__} (numpy from {where(numpy)}, numba from "
      f"{where(numba)}); scipy, torch and jax (where installed) work with it")
PYEOF
cat > "$WORK/packages.py" <<'PYEOF'
import importlib, os, sysconfig
for name in ("numpy", "numba", "pytensor", "torch", "torchaudio", "jax", "cupy", "scipy", "filelock", "tqdm",
             "pytest", "pytest_timeout", "xdist"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f", CUDA available: {m.cuda.is_available()}"
        if name == "jax":
            extra = f", default backend: {m.default_backend()}"
        print(f"  {name:<15} {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:
        print(f"  {name:<15} NOT importable: {type(e).__name__}: {str(e)[:200]}")
import ctypes.util, glob
try:
    import nvidia.cublas
    wheel = sorted(glob.glob(os.path.join(list(nvidia.cublas.__path__)[0], "lib", "libcublas.so*")))
except ImportError:
    wheel = []
print(f"  cuBLAS          loader path: {ctypes.util.find_library('cublas') or 'none'}; nvidia-cublas wheel: "
      f"{wheel[0] if wheel else 'none'}")
inc = os.path.join(sysconfig.get_paths()["include"], "Python.h")
print(f"  Python.h        {inc if os.path.exists(inc) else 'missing: PyTensor C modes (C, CVM) cannot compile'}")
PYEOF

install_wheels() {  # target wheels...
    local target=$1 rc
    shift
    log "installing into $target: $(for w in "$@"; do basename "$w" | cut -d- -f1-2; done | paste -sd ' ')"
    timeout "$(limit 90 "$R_SETUP")" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$target" "$@" 2>&1 | tee -a "$REPORT"
    rc=${PIPESTATUS[0]}
    ((rc == 0)) || log "pip install failed (exit $rc)"
    return "$rc"
}

setup() {  # sub-steps bounded so that R_SETUP seconds stay for the other stages
    local wheels=() pure=() heavy=() stacks=() w stack rc base=$ROOT${PYTHONPATH:+:$PYTHONPATH}
    local mode=${GPU_CHECK_NUMBA:-auto}
    shopt -s nullglob
    wheels=("$ROOT"/.whl/*.whl)
    shopt -u nullglob
    for w in "${wheels[@]}"; do
        case $(basename "$w") in numba-*|llvmlite-*|numpy-*) heavy+=("$w") ;; *) pure+=("$w") ;; esac
    done
    if ((${#wheels[@]} == 0)); then
        log "no wheels in .whl/ (scripts/gpu_wheels.sh makes them): using $PY's own packages"
        heavy=()
    elif [[ "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>&1)" != 3.12 ]]; then
        log "$PY is not Python 3.12: the wheels in .whl/ (for 3.12) are not installed; using its own packages"
        heavy=()
    else
        if ((${#pure[@]})); then install_wheels "$WORK/site" "${pure[@]}" || return 1; base=$WORK/site:$base; fi
        if ((${#heavy[@]})) && [[ $mode != machine ]]; then
            install_wheels "$WORK/site-numba" "${heavy[@]}" || return 1
        else
            heavy=()
        fi
    fi
    # The stack CI tests (the wheels' numba 0.65.1 / numpy 2.4) first, then the machine's own numba / numpy.
    if ((${#heavy[@]})); then stacks+=("$WORK/site-numba:$base"); fi
    if [[ $mode != wheels || ${#heavy[@]} -eq 0 ]]; then stacks+=("$base"); fi
    rc=1
    for stack in "${stacks[@]}"; do
        export PYTHONPATH=$stack
        log "probe with PYTHONPATH=$PYTHONPATH"
        timeout "$(limit 120 "$R_SETUP")" "$PY" "$WORK/probe.py" > "$WORK/probe.log" 2>&1
        rc=$?
        if ((rc == 0)); then log "$(cat "$WORK/probe.log")"; break; fi
        ((rc == 124)) && log "probe timed out"
        tail -n 4 "$WORK/probe.log" | tee -a "$REPORT"
    done
    ((rc == 0)) || return 1
    timeout "$(limit 90 "$R_SETUP")" "$PY" "$WORK/packages.py" 2>&1 | tee -a "$REPORT"
    return 0
}
section "setup"
T0=$(now)
if setup; then
    record setup ok "$(since "$T0")"
    SETUP_OK=1
else
    record setup FAILED "$(since "$T0")"
    SETUP_OK=0
fi

# ------------------------------------------------------------------ info, build, tests, bench
if ((SETUP_OK)); then
    run_stage info 60 "$R_INFO" "$PY" -m ptnative info

    T=$(limit 170 "$R_BUILD")
    section "build (limit $T s each, concurrently): python -m ptnative build --device {cuda,cpu} -j $JOBS"
    devices=(cpu)
    if ((HAVE_GPU)); then
        devices=(cuda cpu)
    else
        log "cuda: no GPU, skipped"
        record "build cuda" "skipped (no GPU)" 0
    fi
    for dev in "${devices[@]}"; do
        (
            t0=$(now)
            timeout -k 10 "$T" "$PY" -m ptnative build --device "$dev" -j "$JOBS" > "$WORK/build_$dev.log" 2>&1
            echo "$? $(since "$t0")" > "$WORK/build_$dev.rc"
        ) &
    done
    wait
    for dev in "${devices[@]}"; do
        read -r rc secs < "$WORK/build_$dev.rc"
        log "-- $dev: exit $rc, $secs s"
        # tqdm redraws its bar with \r: keep its last state only
        tr '\r' '\n' < "$WORK/build_$dev.log" | awk 'NF == 0 { next } /^building \(/ { bar = $0; next } { print }
            END { if (bar != "") print bar }' | tail -n 60 | tee -a "$REPORT"
        record "build $dev" "$(status_of "$rc" "$T")" "$secs"
    done

    PYTEST_ARGS=(-q -p no:cacheprovider -rfEs)
    if "$PY" -c 'import pytest_timeout' >/dev/null 2>&1; then
        PYTEST_ARGS+=("--timeout=${GPU_CHECK_TEST_TIMEOUT_S:-120}")
    fi
    if [[ -z "${GPU_CHECK_PYTEST_ARGS+set}" ]] && "$PY" -c 'import xdist' >/dev/null 2>&1; then
        GPU_CHECK_PYTEST_ARGS="-n $((JOBS < 8 ? JOBS : 8))"  # the 63 tests took 40-52 s with -n 8 on an H200
    fi
    read -r -a EXTRA <<< "${GPU_CHECK_PYTEST_ARGS:-}"
    run_stage tests 180 "$R_TESTS" "$PY" -m pytest "${PYTEST_ARGS[@]}" "${EXTRA[@]}" tests/gpu
    run_stage bench 170 0 "$PY" bench/gpu.py  # without a GPU it prints a note and exits 0
    if ((!HAVE_GPU)) && [[ ${ST_STATUS[-1]} == ok ]]; then ST_STATUS[-1]="skipped (no GPU)"; fi
else
    log "setup failed: the other stages are not run"
    for s in info build tests bench; do record "$s" "NOT RUN (setup failed)" 0; done
fi

# ------------------------------------------------------------------ summary
section "summary ($(since "$START") s in all)"
for i in "${!ST_NAME[@]}"; do
    log "$(printf '  %-12s %-34s %8s s' "${ST_NAME[$i]}" "${ST_STATUS[$i]}" "${ST_SECS[$i]}")"
done
log "result: $( ((FAILED)) && echo 'FAILED' || echo 'passed') (report: $REPORT)"
rm -rf "$WORK/site"
exit "$FAILED"
