#!/usr/bin/env bash
# Run edgecap's runtime tests on aarch64 under qemu-user, with the aarch64 wheels
# pip picks for a board. See docs/aarch64.md.
#
# Usage: tools/aarch64/check.sh [py39|py39-tflite213|py311|py311-litert2|all] [pytest args...]
#   py39   Debian bullseye root (Python 3.9), tflite-runtime 2.11.0, numpy<2 (so
#          opencv-python-headless 4.11): what Coral's own libedgetpu 16.0 needs
#   py39-tflite213  the same with tflite-runtime 2.13.0 (a libedgetpu rebuilt for TF 2.13)
#   py311  Debian bookworm root (Python 3.11), ai-edge-litert<2 (1.4.0 on aarch64)
#   py311-litert2  the same with the newest ai-edge-litert (2.x)
# With no pytest args it runs RUNTIME_TESTS (below), then captions the demo.
# The last line is a summary `make test-boards` reads:
#   aarch64-check: CONFIG: N passed, N failed, N skipped; demo K/3 captions ok; S s
#
# Everything downloaded is cached under $EDGECAP_AARCH64_CACHE (default
# ~/.cache/edgecap-aarch64): the Debian roots, the wheels and their unpacked tree.
# A second run downloads nothing. Delete the directory to start over.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${EDGECAP_AARCH64_CACHE:-$HOME/.cache/edgecap-aarch64}"
CONFIG="${1:-py311}"
[ $# -gt 0 ] && shift
PYTEST_ARGS=("$@")

log() { echo "aarch64-check: $*" >&2; }
die() { log "$*"; exit 2; }

# The packages the runtime needs on a board, as pip would resolve them there.
# Kept in step with pyproject.toml's dependencies, `service` extra and `pytest`.
COMMON_REQS=(opencv-python-headless psutil msgspec tqdm pytest paho-mqtt prometheus-client)

# The runtime tests that need neither the compiler (edgecap_compile needs
# ai_edge_litert.tools.flatbuffer_utils, absent from 1.x and tflite-runtime) nor
# host tools (chromium, systemd, mosquitto, the package index).
RUNTIME_TESTS=(tests/test_bundle.py tests/test_captioner.py tests/test_scheduler.py
               tests/test_sources.py tests/test_window_state.py tests/test_tflite_verify.py
               tests/test_opencv_versions.py)
# Tests known to crash the native interpreter (none now: tflite-runtime 2.13.0
# segfaulted on a truncated model until edgecap/tflite_verify.py checked files first).
PY39_CRASHERS=()

# pip download evaluates environment markers for the host's Python, not for
# --python-version, so 3.9's conditional requirements are named here.
PY39_MARKER_REQS=(tomli exceptiongroup typing-extensions)

config() {
    case "$1" in
        # ai-edge-litert 2.x (manylinux_2_27_aarch64) is what an unpinned pip takes
        # on a board; under qemu 7.2 its Interpreter() segfaults (docs/aarch64.md),
        # so the runtime tests run on 1.x, and py311-litert2 shows the crash.
        py311) SUITE=bookworm; PYVER=3.11; REQS=(numpy "ai-edge-litert<2" "${COMMON_REQS[@]}") ;;
        py311-litert2) SUITE=bookworm; PYVER=3.11; REQS=(numpy ai-edge-litert "${COMMON_REQS[@]}") ;;
        # Coral's libedgetpu 16.0 loads under tflite-runtime below 2.12 only, whose last
        # wheels are 2.11.0 for CPython 3.7-3.9 (edgecap/data/configurations.json); built
        # against numpy 1.x, and numpy<2 makes pip take opencv-python-headless 4.11.
        py39) SUITE=bullseye; PYVER=3.9; REQS=("numpy<2" "tflite-runtime==2.11.0" "${COMMON_REQS[@]}" "${PY39_MARKER_REQS[@]}") ;;
        py39-tflite213) SUITE=bullseye; PYVER=3.9; REQS=("numpy<2" "tflite-runtime==2.13.0" "${COMMON_REQS[@]}" "${PY39_MARKER_REQS[@]}") ;;
        *) die "unknown configuration '$1'; use py39, py39-tflite213, py311, py311-litert2 or all" ;;
    esac
}

ensure_tools() {
    local missing=()
    command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user-static)
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
    command -v dpkg-deb >/dev/null 2>&1 || missing+=(dpkg)
    if [ ${#missing[@]} -gt 0 ]; then
        local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        log "installing ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
    fi
    PATH="$PATH:/usr/sbin"
}

# The Debian mirror this machine's apt already uses (one-line or deb822 sources),
# so the check goes through the same registry as the system package manager.
debian_mirror() {
    local uri
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
          | awk '$1=="deb" && $2 !~ /security/ {print $2; exit}')
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
              | awk '$1=="URIs:" && $2 !~ /security/ {print $2; exit}')
    fi
    [ -n "$uri" ] || die "no Debian mirror in /etc/apt/sources.list(.d); add one"
    echo "$uri"
}

# debootstrap --foreign downloads and unpacks the base; its second stage would need
# to run arm64 binaries (binfmt_misc). Unpacking every fetched .deb is enough to run
# python3 under `qemu-aarch64-static -L ROOT`: no maintainer scripts are needed.
ensure_root() {
    local root="$CACHE/root-$SUITE"
    [ -f "$root/.ready" ] && return
    [ "$(id -u)" -eq 0 ] || die "building the Debian root needs root (debootstrap); run once with sudo"
    rm -rf "$root"
    local mirror; mirror=$(debian_mirror)
    log "building arm64 $SUITE root from $mirror (first run only)"
    debootstrap --foreign --arch=arm64 --variant=minbase --include=python3,python3-venv \
        "$SUITE" "$root" "$mirror" > "$CACHE/debootstrap-$SUITE.log" 2>&1 \
        || die "debootstrap failed; see $CACHE/debootstrap-$SUITE.log"
    local deb
    for deb in "$root"/var/cache/apt/archives/*.deb; do
        dpkg-deb -x "$deb" "$root"
    done
    du -sb "$root/var/cache/apt/archives" | cut -f1 > "$root/.download-bytes"
    touch "$root/.ready"
}

# pip on the x86 host resolves for the board's platform tags; a wheel is a zip, so
# unpacking it into a directory on PYTHONPATH installs it (pip under qemu is slow).
# Board glibc: Mendel (Debian 10) has 2.28, so manylinux_2_17 .. _2_28 are accepted.
ensure_wheels() {
    local wheels="$CACHE/wheels-$CONFIG" site="$CACHE/site-$CONFIG"
    [ -f "$site/.ready" ] && return
    log "downloading aarch64 wheels for $CONFIG (first run only)"
    local platforms=() minor
    for minor in $(seq 17 28); do platforms+=(--platform "manylinux_2_${minor}_aarch64"); done
    python3 -m pip download -q --only-binary=:all: "${platforms[@]}" \
        --platform manylinux2014_aarch64 --platform linux_aarch64 \
        --python-version "$PYVER" --implementation cp -d "$wheels" "${REQS[@]}" \
        2> >(grep -v "^WARNING: Location" >&2)
    rm -rf "$site"; mkdir -p "$site"
    python3 - "$wheels" "$site" <<'EOF'
import pathlib, sys, zipfile
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    zipfile.ZipFile(wheel).extractall(sys.argv[2])
EOF
    du -sb "$wheels" | cut -f1 > "$site/.download-bytes"
    touch "$site/.ready"
}

# Child processes of the tests (sys.executable) must run under qemu too: without
# binfmt_misc the kernel cannot exec an arm64 binary, so sys.executable is made a
# host wrapper (qemu's -0 sets the guest's argv[0]) that starts qemu again.
write_wrapper() {
    local bin="$CACHE/bin-$CONFIG"
    mkdir -p "$bin"
    cat > "$bin/python3" <<EOF
#!/bin/sh
exec qemu-aarch64-static -L "$CACHE/root-$SUITE" -0 "\$0" "$CACHE/root-$SUITE/usr/bin/python$PYVER" "\$@"
EOF
    chmod +x "$bin/python3"
    PYTHON="$bin/python3"
}

run_config() {
    CONFIG="$1"
    config "$CONFIG"
    ensure_root
    ensure_wheels
    write_wrapper
    # edgecap_compile is the source tree's compile/ (pyproject's package-dir), as
    # an installed wheel lays it out.
    local shim; shim=$(mktemp -d)
    ln -s "$REPO/compile" "$shim/edgecap_compile"
    local args=("${PYTEST_ARGS[@]}") crashers=()
    if [ ${#args[@]} -eq 0 ]; then
        args=(-q -rfE "${RUNTIME_TESTS[@]}")
        # A segfault ends pytest's process, so a test known to crash the native
        # interpreter runs alone after the others, and counts as a failure.
        [ "$CONFIG" = py39 ] && crashers=("${PY39_CRASHERS[@]}")
        local t; for t in "${crashers[@]}"; do args+=(--deselect "$t"); done
    fi
    log "$CONFIG: $("$PYTHON" -c 'import platform, sys; print(platform.machine(), "Python", sys.version.split()[0])')"
    local start=$SECONDS rc=0 t out="$CACHE/pytest-$CONFIG.log"
    (cd "$REPO" && PYTHONPATH="$shim:$CACHE/site-$CONFIG" "$PYTHON" -m pytest -p no:cacheprovider "${args[@]}") \
        2>&1 | tee "$out" || true
    rc=${PIPESTATUS[0]}
    for t in "${crashers[@]}"; do
        local trc=0
        (cd "$REPO" && PYTHONPATH="$shim:$CACHE/site-$CONFIG" "$PYTHON" -m pytest -p no:cacheprovider -q "$t" >/dev/null 2>&1) || trc=$?
        if [ $trc -eq 0 ]; then log "$CONFIG: $t passed (no longer crashes: drop it from PY39_CRASHERS)"
        else log "$CONFIG: $t FAILED (exit $trc$([ $trc -ge 128 ] && echo ", signal $((trc - 128))"))"; rc=1; fi
    done
    # The demo, as `make demo` captions it: each caption line ends "(truth: ...; ok)" when it matches.
    local demo=0
    if [ ${#PYTEST_ARGS[@]} -eq 0 ]; then
        demo=$(cd "$REPO" && PYTHONPATH="$shim:$REPO:$CACHE/site-$CONFIG" "$PYTHON" -m edgecap.cli caption 2>&1 \
               | tee "$CACHE/demo-$CONFIG.log" | grep -c '; ok)$' || true)
    fi
    rm -rf "$shim"
    log "$CONFIG: pytest exit $rc in $((SECONDS - start)) s;" \
        "first-run download: root $(( $(cat "$CACHE/root-$SUITE/.download-bytes") / 1048576 )) MiB," \
        "wheels $(( $(cat "$CACHE/site-$CONFIG/.download-bytes") / 1048576 )) MiB"
    local counts
    counts=$(tail -n 1 "$out" | python3 -c '
import re, sys
n = {k.rstrip("s"): int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", sys.stdin.read())}
print("%d passed, %d failed, %d skipped" % (n.get("passed", 0), n.get("failed", 0) + n.get("error", 0),
                                           n.get("skipped", 0)))')
    log "$CONFIG: $counts; demo $demo/3 captions ok; $((SECONDS - start)) s"
    [ ${#PYTEST_ARGS[@]} -gt 0 ] || [ "$demo" -eq 3 ] || rc=1
    return $rc
}

mkdir -p "$CACHE"
ensure_tools
if [ "$CONFIG" = all ]; then
    rc=0
    run_config py39 || rc=$?
    run_config py311 || rc=$?
    exit $rc
fi
run_config "$CONFIG"
