#!/usr/bin/env bash
# `make test-aarch64`: ptnative installed and tested on aarch64 Linux, under emulation (docs/install.md, "aarch64").
# Needs root (mount, chroot), qemu-user-static, mmdebstrap and the network (Debian's mirror, PyPI).  From nothing:
#  1. binfmt_misc mounted at /proc/sys/fs/binfmt_misc if absent, and qemu-user-static's aarch64 handler registered
#     (with the F flag: the interpreter is opened now, so it also runs inside the chroot);
#  2. an arm64 Debian bookworm (Python 3.11, g++ 12) made by mmdebstrap in $AARCH64_DIR/rootfs (default .aarch64/,
#     ignored by git), reused when a previous run completed it;
#  3. in it, a new venv with the aarch64 wheels of numpy, scipy, PyTensor, numba from PyPI, and ptnative installed
#     from a copy of this checkout with PTNATIVE_PREBUILD=0: every kernel is compiled by the aarch64 g++ inside
#     the chroot, emulated, into a kernel cache emptied first (PyTensor's compiledir too);
#  4. pytest on the generic-op tests, the Makefile's MATRIX_TESTS (one every-mode reference test per family) and
#     HMM and CTC tests in float32 and float64 (AARCH64_TESTS, below), ending with pytest's summary.
# Extra pytest arguments: AARCH64_PYTEST_ARGS; pytest-xdist processes: AARCH64_JOBS (default 2).  The run's time is printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
dir=${AARCH64_DIR:-$src/.aarch64}
rootfs=$dir/rootfs
start=$(date +%s)
say() { echo "test-aarch64 [$(( $(date +%s) - start )) s]: $*"; }

if [ "$(id -u)" != 0 ]; then echo "test-aarch64: needs root (binfmt_misc, mmdebstrap, chroot)" >&2; exit 2; fi
for tool in mmdebstrap qemu-aarch64-static chroot; do
    command -v $tool >/dev/null || { echo "test-aarch64: $tool not found (apt-get install mmdebstrap qemu-user-static)" >&2; exit 2; }
done

# 1. arm64 binaries run through qemu
binfmt=/proc/sys/fs/binfmt_misc
[ -e $binfmt/register ] || mount -t binfmt_misc binfmt_misc $binfmt
if [ ! -e $binfmt/qemu-aarch64 ]; then
    cat /usr/lib/binfmt.d/qemu-aarch64.conf > $binfmt/register
fi

# 2. the arm64 Debian, made once
if [ ! -e "$rootfs/.ptnative-rootfs-complete" ]; then
    say "creating the arm64 Debian bookworm in $rootfs (mmdebstrap, several minutes)"
    rm -rf "$rootfs" "$rootfs.tmp"
    mkdir -p "$dir"
    mmdebstrap --arch=arm64 --variant=apt \
        --include=python3,python3-venv,python3-pip,python3-dev,g++,ca-certificates bookworm "$rootfs.tmp"
    mv "$rootfs.tmp" "$rootfs"
    touch "$rootfs/.ptnative-rootfs-complete"
fi
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
# this machine's certificate authorities (a proxy's included), for pip
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"

mounted=()
cleanup() { for m in "${mounted[@]}"; do umount "$m" || umount -l "$m" || true; done; }
trap cleanup EXIT
for m in proc dev; do
    if ! mountpoint -q "$rootfs/$m"; then mount --bind /$m "$rootfs/$m"; mounted=("$rootfs/$m" "${mounted[@]}"); fi
done
in_root() { chroot "$rootfs" /usr/bin/env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"; }
in_root uname -m | grep -qx aarch64 || { echo "test-aarch64: the chroot does not run aarch64 code" >&2; exit 1; }

# 3. a new venv, and ptnative from a copy of the checkout (the files git knows, as they are in the work tree)
say "copying the checkout and creating the venv"
rm -rf "$rootfs/opt/src" "$rootfs/opt/venv" "$rootfs/opt/cache" "$rootfs/opt/pytensor"
mkdir -p "$rootfs/opt/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -C "$rootfs/opt/src" -xf -
in_root python3 -m venv /opt/venv
# The test extras but jax (JAX mode's tests skip without it; XLA under emulation would take most of the time).
say "installing ptnative and its dependencies (aarch64 wheels from PyPI; PTNATIVE_PREBUILD=0)"
in_root env PTNATIVE_PREBUILD=0 pip install --quiet "/opt/src" "pytest>=8,<10" "pytest-xdist>=3.5,<4" "hypothesis>=6.100,<7"
in_root python -c 'import platform, numpy, scipy, pytensor, numba, ptnative
print("test-aarch64:", platform.machine(), "Python", platform.python_version(), "numpy", numpy.__version__,
      "scipy", scipy.__version__, "pytensor", pytensor.__version__, "numba", numba.__version__)'

# 4. the tests, against the installed package, every kernel compiled in the chroot
matrix_tests=$(make -s -C "$src" --no-print-directory print-matrix-tests)
# HMM: the likelihood ops (forward-backward, its gradient, the fused value-and-gradient op: the units GCC 12 once
# failed to compile for aarch64) in every mode and both floating types, and their log-space fallback; CTC: the loss
# against Graves' recursion in every mode and both floating types; the vector layer (c_code/common/simd.h, whose
# register-sized form g++ gets on aarch64) against the plain vector extensions.  Each kernel is compiled under
# emulation (an HMM unit takes minutes), so the selection keeps to these.
AARCH64_TESTS=${AARCH64_TESTS:-"$matrix_tests
    tests/test_fsa.py::test_hmm_against_reference tests/test_fsa.py::test_hmm_log_space_fallback
    tests/test_hmm.py::test_log_likelihood_value_and_gradient_in_one_op
    tests/test_fsa.py::test_ctc_loss_against_graves tests/test_simd.py"}
say "running pytest"
set +e
in_root env PTNATIVE_CACHE_DIR=/opt/cache PYTENSOR_FLAGS=base_compiledir=/opt/pytensor \
    sh -c "cd /opt/src && exec pytest --import-mode=importlib -q -p no:cacheprovider -n ${AARCH64_JOBS:-2} --durations=10 \
    $(echo $AARCH64_TESTS) ${AARCH64_PYTEST_ARGS:-}"
rc=$?
set -e
say "done (pytest exit status $rc), $(( $(date +%s) - start )) s in all"
exit $rc
