#!/usr/bin/env bash
# Creates (or reuses) a virtual environment in the checkout and installs lightning-fullgraph
# into it, editable, without build isolation. Skips everything when nothing changed since the
# last run (stamp file in the environment + a quick check that the packages are there).
#
# Environment variables:
#   LIGHTNING_FULLGRAPH_VENV     the environment (default: <checkout>/.venv; relative paths are
#                                taken from the checkout)
#   PYTHON                       interpreter that creates it (default: python3; needs >= 3.10)
#   LIGHTNING_FULLGRAPH_SYSTEM_SITE_PACKAGES=1
#                                create it with --system-site-packages, so that a system-wide
#                                torch (e.g. a CUDA build) is used instead of installing one
#   TORCH_VERSION                torch installed when the environment has none (default 2.13.0)
#   TORCH_INDEX_URL              pip --index-url for that torch, e.g.
#                                https://download.pytorch.org/whl/cpu for the CPU-only build
#   EXTRAS                       comma-separated extras (test, triton, fabric, scatter, plot);
#                                extras installed by an earlier run are kept. Unset: plot
#                                (matplotlib, for `lightning-fullgraph plan --plot`); set it
#                                (also empty) to choose exactly
#   LIGHTNING_FULLGRAPH_SETUP_VERBOSE=1   show pip's output
#
# A torch already importable in the environment is kept (a GPU user's CUDA build): torch is
# only installed when there is none, because an unpinned torch requirement makes pip pull
# several GB of CUDA wheels.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

say() { echo "[setup] $*" >&2; }
die() { echo "[setup] error: $*" >&2; exit 1; }

VENV=${LIGHTNING_FULLGRAPH_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
BASE_PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
EXTRAS=${EXTRAS-plot}
PIP_QUIET=(--quiet)
[ "${LIGHTNING_FULLGRAPH_SETUP_VERBOSE:-0}" = 1 ] && PIP_QUIET=()

# --- the virtual environment --------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$BASE_PY" >/dev/null 2>&1 || die "'$BASE_PY' not found; set PYTHON to a Python >= 3.10"
  "$BASE_PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$("$BASE_PY" -V 2>&1) is too old: Python >= 3.10 is needed (set PYTHON=python3.11, ...)"
  venv_args=()
  if [ "${LIGHTNING_FULLGRAPH_SYSTEM_SITE_PACKAGES:-0}" = 1 ]; then
    venv_args+=(--system-site-packages)
    say "creating virtual environment $VENV ($("$BASE_PY" -V 2>&1), with system site packages) ..."
  else
    say "creating virtual environment $VENV ($("$BASE_PY" -V 2>&1)) ..."
  fi
  "$BASE_PY" -m venv ${venv_args[@]+"${venv_args[@]}"} "$VENV" \
    || die "could not create $VENV (on Debian/Ubuntu: apt-get install python3-venv)"
elif [ "${LIGHTNING_FULLGRAPH_SYSTEM_SITE_PACKAGES:-0}" = 1 ] \
    && ! grep -qi '^include-system-site-packages *= *true' "$VENV/pyvenv.cfg" 2>/dev/null; then
  say "note: $VENV exists without system site packages; remove it to recreate it with them"
fi
PY="$VENV/bin/python"

# --- up to date? -----------------------------------------------------------------------------
# The stamp records a hash of what the installation depends on (pyproject.toml, setup.py, this
# script, the interpreter, the checkout's path) and the extras installed. The installation is
# current when the hash matches, the requested extras were installed, and every requirement
# of the installed lightning-fullgraph (with those extras) is still present, from this checkout.
STAMP="$VENV/.lightning-fullgraph-setup"
state=$("$PY" - "$ROOT" "$STAMP" "$EXTRAS" <<'PYEOF'
import hashlib, importlib.metadata as md, importlib.util, os, re, sys

root, stamp, extras = sys.argv[1], sys.argv[2], sys.argv[3]
# Look at what is installed, not at the checkout in the working directory.
sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(root)]
h = hashlib.sha256()
for name in ("pyproject.toml", "setup.py", "scripts/install.sh"):
    path = os.path.join(root, name)
    h.update(name.encode() + b"\0")
    if os.path.exists(path):
        with open(path, "rb") as fh:
            h.update(fh.read())
h.update(sys.version.encode() + os.path.realpath(root).encode())
digest = h.hexdigest()
want = {e.strip() for e in extras.split(",") if e.strip()}
have = set()
try:
    with open(stamp) as fh:
        old_digest, *old_extras = fh.read().split("\n")
    have = {e for e in ",".join(old_extras).split(",") if e}
except OSError:
    old_digest = ""
union = ",".join(sorted(want | have))


def current():
    if old_digest != digest or not want <= have:
        return False
    spec = importlib.util.find_spec("lightning_fullgraph")
    if spec is None or not os.path.realpath(spec.origin).startswith(os.path.realpath(root) + os.sep):
        return False
    for req in md.requires("lightning-fullgraph") or []:
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if extra and extra.group(1) not in have:
            continue
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            return False
    return True


try:
    ok = current()
except Exception:
    ok = False
torch = importlib.util.find_spec("torch") is not None
print("current" if ok else "stale", digest, union or "-", "torch" if torch else "no-torch")
PYEOF
) || die "$PY does not run; remove $VENV to recreate it"
read -r status digest extras has_torch <<<"$state"
[ "$extras" = "-" ] && extras=""

if [ "$status" = current ]; then
  say "up to date ($VENV${extras:+, extras: $extras})"
  exit 0
fi

# --- install ---------------------------------------------------------------------------------
rm -f "$STAMP"
start=$SECONDS
# Builds run without isolation (an isolated build env would resolve its own, CUDA, torch), so
# the build backend must be in the environment; >= 70.1 builds wheels without "wheel".
if ! "$PY" -c 'import setuptools, sys; sys.exit(tuple(map(int, setuptools.__version__.split(".")[:2])) < (70, 1))' 2>/dev/null; then
  say "installing setuptools (build backend) ..."
  "$PY" -m pip install ${PIP_QUIET[@]+"${PIP_QUIET[@]}"} "setuptools>=70.1"
fi
if [ "$has_torch" = torch ]; then
  say "keeping the installed torch $("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo '(version unknown)')"
else
  index=()
  [ -n "${TORCH_INDEX_URL:-}" ] && index=(--index-url "$TORCH_INDEX_URL")
  say "installing torch==$TORCH_VERSION${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} (the largest download; a few minutes on a slow link) ..."
  "$PY" -m pip install ${PIP_QUIET[@]+"${PIP_QUIET[@]}"} ${index[@]+"${index[@]}"} "torch==$TORCH_VERSION"
fi
target="."
[ -n "$extras" ] && target=".[$extras]"
say "installing lightning-fullgraph (editable) and its dependencies${extras:+, extras: $extras} ..."
"$PY" -m pip install ${PIP_QUIET[@]+"${PIP_QUIET[@]}"} --no-build-isolation -e "$target"
"$PY" -c 'import lightning_fullgraph, torch, torch_geometric, lightning, pymetis, scipy' \
  || die "the installation does not import; see the messages above"
printf '%s\n%s\n' "$digest" "$extras" >"$STAMP"
say "done in $((SECONDS - start)) s ($VENV)"
