#!/bin/sh
# Takes out what deploy/install.sh put in: the service (stopped and disabled), the
# unit, the udev rules, the virtual environment and the example config. The config,
# the bundle, the cached plans and the caption logs stay unless --purge is given;
# --purge also removes the accounts install.sh created (and only those).
# Running it again changes nothing.
set -eu

usage() {
    cat <<'EOF'
usage: sudo sh deploy/uninstall.sh [options]

  --prefix DIR   the virtual environment install.sh made (default /opt/edgecap)
  --root DIR     the staging root install.sh was given (no systemctl/udevadm calls
                 beyond systemctl --root, no accounts)
  --purge        also remove /etc/edgecap, /var/lib/edgecap, /var/cache/edgecap,
                 /var/log/edgecap and the user and groups install.sh created
  -h, --help     this text
EOF
}

say() { printf 'edgecap-uninstall: %s\n' "$*"; }
die() { printf 'edgecap-uninstall: error: %s\n' "$*" >&2; exit "${2:-1}"; }

PREFIX="/opt/edgecap"
ROOT=""
PURGE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a directory" 2; PREFIX="$2"; shift 2 ;;
        --prefix=*) PREFIX="${1#*=}"; shift ;;
        --root) [ $# -ge 2 ] || die "--root needs a directory" 2; ROOT="$2"; shift 2 ;;
        --root=*) ROOT="${1#*=}"; shift ;;
        --purge) PURGE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" 2 ;;
    esac
done
case "$PREFIX" in /|"") die "--prefix $PREFIX: refusing to remove that" 2 ;; /*) ;; *) die "--prefix $PREFIX: must be an absolute path" 2 ;; esac
if [ -n "$ROOT" ]; then
    [ -d "$ROOT" ] || die "--root $ROOT: no such directory" 2
    ROOT=$(cd "$ROOT" && pwd)
    [ "$ROOT" != "/" ] || ROOT=""
fi
if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (sudo), or give the staging root with --root DIR" 2
fi

SERVICE=edgecap
UNIT="$ROOT/etc/systemd/system/$SERVICE.service"
RULES="$ROOT/etc/udev/rules.d/70-edgecap-coral.rules"
CONFDIR="$ROOT/etc/edgecap"
RECORD="$CONFDIR/install-record"
VENV="$ROOT$PREFIX"

gone() {
    if [ -e "$1" ] || [ -L "$1" ]; then
        rm -rf "$1"
        say "removed $1"
    fi
}

# 1. Stop and disable first, so nothing runs from files about to go.
if [ -e "$UNIT" ]; then
    if [ -n "$ROOT" ]; then
        if command -v systemctl >/dev/null 2>&1; then
            systemctl --root="$ROOT" --quiet disable "$SERVICE.service" 2>/dev/null || true
        fi
    elif [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        systemctl --quiet disable --now "$SERVICE.service" || true
    else
        systemctl --quiet disable "$SERVICE.service" 2>/dev/null || true
    fi
fi
# A drop-in from `systemctl edit edgecap` belongs to the unit.
gone "$ROOT/etc/systemd/system/$SERVICE.service.d"
gone "$UNIT"
gone "$RULES"
if [ -f "$VENV/pyvenv.cfg" ]; then
    gone "$VENV"
elif [ -e "$VENV" ]; then
    say "left $VENV alone: it is not a virtual environment"
fi
gone "$CONFDIR/edgecap.toml.example"

if [ -z "$ROOT" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload
    systemctl reset-failed "$SERVICE.service" 2>/dev/null || true
    if command -v udevadm >/dev/null 2>&1; then
        udevadm control --reload
    fi
fi

# 2. The user's data and the accounts, on request only.
if [ "$PURGE" -eq 1 ]; then
    if [ -z "$ROOT" ] && [ -f "$RECORD" ]; then
        # Only the lines install.sh writes are acted on.
        if grep -qx "user edgecap" "$RECORD"; then
            userdel edgecap 2>/dev/null && say "removed user edgecap" || true
        fi
        for group in edgecap apex plugdev video; do
            if grep -qx "group $group" "$RECORD"; then
                groupdel "$group" 2>/dev/null && say "removed group $group" || true
            fi
        done
    fi
    gone "$CONFDIR"
    gone "$ROOT/var/lib/edgecap"
    gone "$ROOT/var/lib/private/edgecap"
    gone "$ROOT/var/cache/edgecap"
    gone "$ROOT/var/log/edgecap"
else
    if [ -d "$CONFDIR" ] || [ -d "$ROOT/var/lib/edgecap" ]; then
        say "kept $CONFDIR and $ROOT/var/lib/edgecap (--purge removes them)"
    fi
fi
say "done"
