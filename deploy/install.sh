#!/bin/sh
# Installs edgecap as a systemd service: a virtual environment with
# edgecap[service], the unit, the udev rules for the Coral Edge TPUs, and the
# example config. Running it again changes nothing that is already in place.
# deploy/uninstall.sh takes it out again. Walkthrough: docs/deploy.md.
set -eu
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The venv must be readable by the service user whatever root's umask is; the
# config gets its restrictive modes explicitly.
umask 022

usage() {
    cat <<'EOF'
usage: sudo sh deploy/install.sh [options]

  --python PATH       interpreter for the virtual environment (3.9 or newer);
                      default: the first of python3, python3.13 ... python3.9 on PATH
                      that is new enough
  --wheel FILE        install this edgecap wheel (default: the source checkout
                      this script lives in, built into a wheel first)
  --source DIR        install from this source checkout
  --prefix DIR        where the virtual environment goes (default /opt/edgecap)
  --root DIR          stage everything under DIR instead of / (packaging, tests):
                      no accounts, no ownership, no systemctl/udevadm calls
  --pip-option OPT    pass OPT to pip install (repeatable), e.g. for a board
                      without internet: --pip-option=--no-index
                      --pip-option=--find-links=/media/usb/wheels
  --reinstall         reinstall edgecap even if the same version is installed
  --pcie-tpu WHEN     order the service after the PCIe Edge TPU (/dev/apex_0) with
                      the drop-in edgecap-apex.conf: auto (default: when this
                      machine has one, PCI ID 1ac1:089a; a staging root is looked
                      at under DIR/sys), yes, or no
  --libedgetpu VER    the libedgetpu to install for, as its Debian package version
                      (16.0: Coral's; 16.0tf2.17.0: a rebuild; none), instead of
                      what dpkg says is installed (an image built elsewhere)
  --start             start (or restart) the service after installing it
  -h, --help          this text

With Coral's libedgetpu 16.0 installed it installs the one combination that runs it
(edgecap/data/configurations.json, docs/deploy.md): a Python 3.9 venv with
tflite-runtime 2.11.0, numpy<2 and OpenCV 4.11; with a rebuilt libedgetpu, the
interpreter that rebuild loads under. Where nothing can work (a 32-bit userland;
no Python the combination has wheels for) it stops before writing anything.
EOF
}

say() { printf 'edgecap-install: %s\n' "$*"; }
die() { printf 'edgecap-install: error: %s\n' "$1" >&2; exit "${2:-1}"; }

PYTHON=""
WHEEL=""
SOURCE=""
PREFIX="/opt/edgecap"
ROOT=""
PIP_OPTIONS=""
REINSTALL=0
START=0
PCIE_TPU=auto
LIBEDGETPU=""

while [ $# -gt 0 ]; do
    case "$1" in
        --python) [ $# -ge 2 ] || die "--python needs a path" 2; PYTHON="$2"; shift 2 ;;
        --python=*) PYTHON="${1#*=}"; shift ;;
        --wheel) [ $# -ge 2 ] || die "--wheel needs a file" 2; WHEEL="$2"; shift 2 ;;
        --wheel=*) WHEEL="${1#*=}"; shift ;;
        --source) [ $# -ge 2 ] || die "--source needs a directory" 2; SOURCE="$2"; shift 2 ;;
        --source=*) SOURCE="${1#*=}"; shift ;;
        --prefix) [ $# -ge 2 ] || die "--prefix needs a directory" 2; PREFIX="$2"; shift 2 ;;
        --prefix=*) PREFIX="${1#*=}"; shift ;;
        --root) [ $# -ge 2 ] || die "--root needs a directory" 2; ROOT="$2"; shift 2 ;;
        --root=*) ROOT="${1#*=}"; shift ;;
        --pip-option) [ $# -ge 2 ] || die "--pip-option needs a value" 2
                      PIP_OPTIONS="$PIP_OPTIONS $2"; shift 2 ;;
        --pip-option=*) PIP_OPTIONS="$PIP_OPTIONS ${1#*=}"; shift ;;
        --reinstall) REINSTALL=1; shift ;;
        --pcie-tpu) [ $# -ge 2 ] || die "--pcie-tpu needs auto, yes or no" 2; PCIE_TPU="$2"; shift 2 ;;
        --pcie-tpu=*) PCIE_TPU="${1#*=}"; shift ;;
        --libedgetpu) [ $# -ge 2 ] || die "--libedgetpu needs a version or none" 2; LIBEDGETPU="$2"; shift 2 ;;
        --libedgetpu=*) LIBEDGETPU="${1#*=}"; shift ;;
        --start) START=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" 2 ;;
    esac
done

# The interpreter comes first: on Mendel Linux the answer is usually "not this one",
# and nothing should be written before the user knows what to do about it.
version_of() {
    "$1" -I -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

new_enough() {
    case "$1" in
        [0-9]*.[0-9]*) ;;
        *) return 1 ;;
    esac
    major=${1%%.*}
    minor=${1#*.}
    [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 9 ]; }
}

too_old() {
    cat >&2 <<EOF
edgecap-install: error: edgecap needs Python 3.9 or newer; $1 is ${2:-not a Python}.
Mendel Linux 4 and 5 (Debian 10 "buster") ship Python 3.7, and Debian has no newer
python3 for buster (its Python 3.9 arrived with Debian 11). Two ways that work on a
Coral Dev Board (aarch64, glibc 2.28):

  1. A prebuilt CPython from uv (python-build-standalone builds for aarch64 Linux),
     installed outside /root and /home, which the service cannot see:
       curl -LsSf https://astral.sh/uv/install.sh | sh
       sudo UV_PYTHON_INSTALL_DIR=/opt/python ~/.local/bin/uv python install 3.11
       sudo sh deploy/install.sh --python "\$(UV_PYTHON_INSTALL_DIR=/opt/python ~/.local/bin/uv python find 3.11)"

  2. Build one with pyenv (slow: it compiles CPython on the board), also outside
     /root and /home:
       sudo apt-get install build-essential libssl-dev zlib1g-dev libbz2-dev \\
           libreadline-dev libsqlite3-dev libffi-dev liblzma-dev
       sudo git clone https://github.com/pyenv/pyenv /opt/pyenv
       sudo PYENV_ROOT=/opt/pyenv /opt/pyenv/bin/pyenv install 3.11
       sudo sh deploy/install.sh --python /opt/pyenv/versions/3.11.*/bin/python3

Every runtime dependency has prebuilt aarch64 wheels for Python 3.9 and 3.11, so pip
compiles nothing on the board. Details: docs/deploy.md.
EOF
    exit 1
}

HERE=$(cd "$(dirname "$0")" && pwd)
MATRIX="$HERE/../edgecap/data/configurations.json"

# Where nothing can work, say so first, in one line: no interpreter, numpy or OpenCV
# wheel on PyPI runs a 32-bit userland (a 64-bit kernel may run it: ask the userland).
bits=$(getconf LONG_BIT 2>/dev/null || echo 64)
if [ "$bits" = 32 ]; then
    die "this is a 32-bit userland ($(dpkg --print-architecture 2>/dev/null || echo 32-bit) on a $(uname -m) kernel): ai-edge-litert has no 32-bit ARM wheel and numpy, OpenCV, msgspec and psutil have none on PyPI; install the 64-bit OS (e.g. Raspberry Pi OS 64-bit) and run this again" 1
fi

# The libedgetpu decides the combination (the matrix in edgecap/data/configurations.json).
if [ -z "$LIBEDGETPU" ] && command -v dpkg-query >/dev/null 2>&1; then
    LIBEDGETPU=$(dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\n' libedgetpu1-std libedgetpu1-max \
                 2>/dev/null | awk '$3 == "installed" {print $2; exit}')
fi
[ "$LIBEDGETPU" != none ] || LIBEDGETPU=""
STACK=""
if [ -n "$LIBEDGETPU" ]; then
    reader=""
    for candidate in python3 python3.13 python3.12 python3.11 python3.10 python3.9 python3.8 python3.7; do
        if command -v "$candidate" >/dev/null 2>&1 \
                && [ "$("$candidate" -I -c 'import json, re; print("ok")' 2>/dev/null)" = ok ]; then
            reader=$candidate; break
        fi
    done
    [ -n "$reader" ] || die "no python3 to read $MATRIX with" 1
    # id|interpreter numpy opencv|Pythons, for the first stack that runs this libedgetpu.
    STACK=$("$reader" -I - "$MATRIX" "$LIBEDGETPU" <<'PY'
import json, re, sys
matrix, version = json.load(open(sys.argv[1])), sys.argv[2]
num = lambda t: tuple(int(n) for n in re.findall(r"\d+", t or "")[:3])
m = re.match(r"^16\.0tf(\d+\.\d+(\.\d+)?)", version)
build, tf = ("rebuilt", m.group(1)) if m else (("coral-tf2.5", None) if re.match(r"^16\.0(-\d+)?$", version) else (None, None))
for s in matrix["stacks"]:
    if s["build"] == build and (tf is None or ((not s["tf_min"] or num(tf) >= num(s["tf_min"]))
                                               and (not s["tf_below"] or num(tf) < num(s["tf_below"])))):
        print("%s|%s %s %s|%s" % (s["id"], s["interpreter"], s["numpy"], s["opencv"], " ".join(s["python"])))
        break
PY
)
    [ -n "$STACK" ] || say "libedgetpu $LIBEDGETPU: not in the matrix (docs/deploy.md); installing the default interpreter"
fi
STACK_ID="" STACK_PKGS="" STACK_PYTHONS=""
if [ -n "$STACK" ]; then
    STACK_ID=${STACK%%|*}
    rest=${STACK#*|}
    STACK_PKGS=${rest%%|*}
    STACK_PYTHONS=${rest#*|}
fi

fits_stack() {  # whether Python version $1 has the stack's wheels (any, without a stack)
    [ -z "$STACK_PYTHONS" ] && return 0
    for p in $STACK_PYTHONS; do [ "$p" = "$1" ] && return 0; done
    return 1
}

no_python_for_stack() {
    listed="" last=""
    for p in $STACK_PYTHONS; do listed="${listed:+$listed or }$p"; last=$p; done
    die "libedgetpu $LIBEDGETPU needs ${STACK_PKGS%% *}, which has wheels for Python $listed only, and $1; install one outside /root and /home (e.g. sudo UV_PYTHON_INSTALL_DIR=/opt/python uv python install $last) and pass it as --python, or install a libedgetpu rebuilt for newer TFLite (github.com/feranick/libedgetpu)" 1
}

if [ -n "$PYTHON" ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "--python $PYTHON: not found" 2
    PYTHON=$(command -v "$PYTHON")
    v=$(version_of "$PYTHON")
    new_enough "$v" || too_old "$PYTHON" "$v"
    fits_stack "$v" || no_python_for_stack "--python $PYTHON is $v"
else
    first=""
    fitting=""
    for candidate in python3 python3.13 python3.12 python3.11 python3.10 python3.9; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        v=$(version_of "$candidate")
        [ -n "$first" ] || first="$candidate $v"
        if new_enough "$v"; then
            fitting="$candidate $v"
            if fits_stack "$v"; then
                PYTHON=$(command -v "$candidate")
                break
            fi
        fi
    done
    if [ -z "$PYTHON" ]; then
        [ -z "$fitting" ] || no_python_for_stack "this machine's is ${fitting#* } (${fitting% *})"
        [ -n "$first" ] || too_old "python3" "not on PATH"
        too_old "${first% *}" "${first#* }"
    fi
fi
say "Python: $PYTHON ($(version_of "$PYTHON"))"
[ -z "$STACK_ID" ] || say "libedgetpu $LIBEDGETPU: the $STACK_ID combination ($STACK_PKGS)"

if [ -z "$WHEEL" ] && [ -z "$SOURCE" ]; then
    SOURCE=$(dirname "$HERE")
fi
if [ -n "$SOURCE" ]; then
    [ -f "$SOURCE/pyproject.toml" ] || die "--source $SOURCE: no pyproject.toml there; give an edgecap checkout or --wheel FILE" 2
fi
if [ -n "$WHEEL" ]; then
    [ -f "$WHEEL" ] || die "--wheel $WHEEL: no such file" 2
    case "$WHEEL" in /*) ;; *) WHEEL="$(pwd)/$WHEEL" ;; esac
fi
case "$PREFIX" in /*) ;; *) die "--prefix $PREFIX: must be an absolute path" 2 ;; esac
case "$PCIE_TPU" in auto|yes|no) ;; *) die "--pcie-tpu $PCIE_TPU: use auto, yes or no" 2 ;; esac

if [ -n "$ROOT" ]; then
    mkdir -p "$ROOT"
    ROOT=$(cd "$ROOT" && pwd)
    [ "$ROOT" != "/" ] || ROOT=""
fi
if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (sudo), or stage into a directory with --root DIR" 2
fi

# ProtectHome= hides /root and /home from the service: a venv whose interpreter lives
# there would fail to start with status 203/EXEC.
base=$("$PYTHON" -I -c 'import os, sys; print(os.path.realpath(sys.base_prefix))')
case "$base" in
    /root|/root/*|/home|/home/*|/run/user/*)
        if [ -n "$ROOT" ]; then
            say "note: $PYTHON lives under $base, which the service cannot see on a real system"
        else
            die "$PYTHON lives under $base, which the service cannot see (ProtectHome=yes); give --python an interpreter outside /root and /home, e.g. under /opt or /usr" 2
        fi ;;
esac

SERVICE=edgecap
UNIT="$ROOT/etc/systemd/system/$SERVICE.service"
APEX_DROPIN="$ROOT/etc/systemd/system/$SERVICE.service.d/edgecap-apex.conf"
RULES="$ROOT/etc/udev/rules.d/70-edgecap-coral.rules"
CONFDIR="$ROOT/etc/edgecap"
STATEDIR="$ROOT/var/lib/edgecap"
VENV="$ROOT$PREFIX"
# What this script created that the system may already have had (accounts); kept
# with the config, so that uninstall.sh --purge removes only those.
RECORD="$CONFDIR/install-record"

# A real system gets accounts and ownership; a staging root gets neither.
real_system() { [ -z "$ROOT" ]; }

# Writes $2 from $1 with mode $3 unless it already holds exactly that; says so.
put() {
    src=$1 dst=$2 mode=$3
    if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
        chmod "$mode" "$dst"
        return 0
    fi
    mkdir -p "$(dirname "$dst")"
    tmp="$dst.edgecap-new"
    cp "$src" "$tmp"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dst"
    say "installed $dst"
}

record() {
    grep -qx "$1" "$RECORD" 2>/dev/null || printf '%s\n' "$1" >> "$RECORD"
}

# 1. The virtual environment.
if [ -x "$VENV/bin/python" ] && [ "$(version_of "$VENV/bin/python")" = "$(version_of "$PYTHON")" ]; then
    say "virtual environment $VENV is in place"
else
    if [ -f "$VENV/pyvenv.cfg" ]; then
        say "replacing $VENV (its Python is not $(version_of "$PYTHON"))"
        rm -rf "$VENV"
    elif [ -e "$VENV" ] && [ -n "$(ls -A "$VENV")" ]; then
        die "--prefix $PREFIX: $VENV exists and is not a virtual environment; choose another --prefix" 2
    fi
    "$PYTHON" -m venv "$VENV" || die "$PYTHON -m venv failed; on Debian install python3-venv for this Python" 1
    say "created virtual environment $VENV"
fi

# 2. edgecap[service]. A source checkout is built into a wheel first: pip treats a
# wheel of the version already installed as done, so a second run changes nothing.
build=""
if [ -z "$WHEEL" ]; then
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip wheel --quiet --no-deps $PIP_OPTIONS --wheel-dir "$build" "$SOURCE" \
        || die "could not build a wheel from $SOURCE" 1
    WHEEL=$(ls "$build"/edgecap-*.whl)
fi
installed=$("$VENV/bin/python" -I -c 'from importlib.metadata import version; print(version("edgecap"))' 2>/dev/null || true)
wheel_version=$(basename "$WHEEL" | cut -d- -f2)
if [ "$REINSTALL" -eq 1 ]; then
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps $PIP_OPTIONS "$WHEEL" \
        || die "pip install --force-reinstall of $WHEEL failed (see above)" 1
elif [ "$installed" = "$wheel_version" ]; then
    say "edgecap $installed is already installed; --reinstall replaces it with this build"
fi
# The libedgetpu's combination resolves together with edgecap (numpy<2 in the same
# resolve, so that pip never installs numpy 2 first).
set -f  # the requirements hold '<': split them into words, never into globs
# shellcheck disable=SC2086
set -- $STACK_PKGS
set +f
"$VENV/bin/python" -m pip install --quiet $PIP_OPTIONS "${WHEEL}[service]" "$@" \
    || die "pip install of ${WHEEL}[service] $STACK_PKGS failed (see above)" 1
[ -x "$VENV/bin/edgecap" ] || die "$VENV/bin/edgecap is missing after pip install" 1
say "edgecap in $VENV: $("$VENV/bin/python" -I -c 'from importlib.metadata import version; print(version("edgecap"))')"

if [ -f "$HERE/../docs/deploy.md" ]; then
    put "$HERE/../docs/deploy.md" "$VENV/share/doc/edgecap/deploy.md" 0644
fi

# 3. Groups and the service user.
mkdir -p "$CONFDIR"
chmod 0750 "$CONFDIR"
if real_system; then
    for group in video plugdev apex; do
        if ! getent group "$group" >/dev/null; then
            groupadd --system "$group"
            record "group $group"
            say "created group $group"
        fi
    done
    if ! getent passwd edgecap >/dev/null; then
        getent group edgecap >/dev/null || { groupadd --system edgecap; record "group edgecap"; }
        nologin=$(command -v nologin || echo /usr/sbin/nologin)
        useradd --system --gid edgecap --home-dir /var/lib/edgecap --no-create-home \
            --shell "$nologin" --comment "edgecap service" edgecap
        record "user edgecap"
        say "created system user edgecap"
    fi
else
    say "staging root $ROOT: groups video, plugdev, apex and user edgecap are not created"
fi

# 4. Unit and udev rules.
subst=$(mktemp)
trap 'rm -f "$subst"; [ -z "$build" ] || rm -rf "$build"' EXIT
sed "s#@VENV@#$PREFIX#g" "$HERE/edgecap.service" > "$subst"
put "$subst" "$UNIT" 0644
put "$HERE/70-edgecap-coral.rules" "$RULES" 0644

# A PCIe Edge TPU (the Dev Board's own, an M.2 or PCIe card): PCI ID 1ac1:089a, or a
# TPU the apex driver already registered. Read under the staging root, where a
# real /sys is normally absent: an image does not get this machine's hardware.
has_pcie_tpu() {
    sysfs="$ROOT/sys"
    [ -n "$(ls -A "$sysfs/class/apex" 2>/dev/null)" ] && return 0
    for dev in "$sysfs"/bus/pci/devices/*; do
        [ -r "$dev/vendor" ] && [ -r "$dev/device" ] || continue
        if [ "$(cat "$dev/vendor")" = 0x1ac1 ] && [ "$(cat "$dev/device")" = 0x089a ]; then
            return 0
        fi
    done
    return 1
}
# Only with a PCIe TPU: elsewhere waiting for /dev/apex_0 would hold the start
# until the device job timed out (90 s).
if [ "$PCIE_TPU" = yes ] || { [ "$PCIE_TPU" = auto ] && has_pcie_tpu; }; then
    put "$HERE/edgecap-apex.conf" "$APEX_DROPIN" 0644
elif [ -e "$APEX_DROPIN" ]; then
    rm -f "$APEX_DROPIN"
    rmdir "$(dirname "$APEX_DROPIN")" 2>/dev/null || true
    say "removed $APEX_DROPIN (no PCIe Edge TPU)"
fi

# 5. Config: root:edgecap 0750/0640 (it may hold a token and a password); an
# existing config is the user's and is never touched.
put "$HERE/edgecap.toml" "$CONFDIR/edgecap.toml.example" 0640
if [ -e "$CONFDIR/edgecap.toml" ]; then
    say "kept existing $CONFDIR/edgecap.toml (the new example is edgecap.toml.example)"
else
    put "$HERE/edgecap.toml" "$CONFDIR/edgecap.toml" 0640
fi
if real_system; then
    chown root:edgecap "$CONFDIR" "$CONFDIR/edgecap.toml" "$CONFDIR/edgecap.toml.example"
fi

# 6. The demo bundle, so the example config starts: from the checkout (the wheel does
# not carry it), and only where no bundle is installed yet.
DEMO="${SOURCE:-$(dirname "$HERE")}/models/demo/bundle"
if [ -d "$DEMO" ] && [ ! -e "$STATEDIR/bundle" ]; then
    mkdir -p "$STATEDIR"
    chmod 0750 "$STATEDIR"
    cp -R "$DEMO" "$STATEDIR/bundle"
    say "copied the demo bundle to $STATEDIR/bundle"
    if real_system; then
        chown -R edgecap:edgecap "$STATEDIR"
    fi
elif [ ! -e "$STATEDIR/bundle" ]; then
    say "no bundle at $STATEDIR/bundle: copy yours there (or set bundle = in edgecap.toml)"
fi
# What the installed model knows, so that whoever points a real camera at a model of a
# made-up world hears it here, before its captions.
if [ -f "$STATEDIR/bundle/bundle.json" ]; then
    say "$("$PYTHON" -I "$HERE/bundle-domain.py" "$STATEDIR/bundle")"
fi

# 7. Tell systemd and udev; enable, start only when asked.
if [ -n "$ROOT" ]; then
    if command -v systemctl >/dev/null 2>&1; then
        systemctl --root="$ROOT" --quiet enable "$SERVICE.service" 2>/dev/null \
            || say "systemctl --root could not enable $SERVICE.service"
    else
        say "systemctl not found: $SERVICE.service not enabled in $ROOT"
    fi
    say "staging root $ROOT: skipped systemctl daemon-reload and udevadm"
elif [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload
    systemctl --quiet enable "$SERVICE.service"
    if command -v udevadm >/dev/null 2>&1; then
        udevadm control --reload
        # Devices already plugged in get the new modes and groups now.
        udevadm trigger --subsystem-match=apex || true
        udevadm trigger --subsystem-match=usb --attr-match=idVendor=1a6e || true
        udevadm trigger --subsystem-match=usb --attr-match=idVendor=18d1 || true
    fi
    if [ "$START" -eq 1 ]; then
        systemctl restart "$SERVICE.service"
        say "started: journalctl -u $SERVICE -f"
    elif systemctl --quiet is-active "$SERVICE.service"; then
        say "$SERVICE is running the previous install: systemctl restart $SERVICE"
    else
        say "enabled; start it with: systemctl start $SERVICE"
    fi
elif command -v systemctl >/dev/null 2>&1; then
    # An image being built, a chroot: enabling needs no running systemd.
    systemctl --quiet enable "$SERVICE.service" 2>/dev/null \
        || say "systemctl could not enable $SERVICE.service"
    say "systemd is not running here: skipped daemon-reload and udevadm"
else
    say "systemctl not found: $SERVICE.service not enabled; skipped udevadm"
fi
say "done"
