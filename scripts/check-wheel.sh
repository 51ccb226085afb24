#!/usr/bin/env bash
# Build gpuplane's wheel and check it as the image installs it (see Dockerfile):
#   1. build the wheel (pip wheel --no-deps, the build backend of pyproject.toml);
#   2. install it into a fresh virtual environment with the pinned versions of deploy/image/constraints.txt,
#      the file the Dockerfile installs with;
#   3. check that `gpuplane --version` and `kubectl-gpuplane version` print the wheel's version, that every
#      module imports, and that every file the package ships besides Python (templates, static files,
#      scenarios, py.typed) is installed;
#   4. check that the environment holds exactly the pinned versions: every dependency pinned, no pin stale.
#
# Usage: scripts/check-wheel.sh            check (CI runs this from scripts/test.sh)
#        scripts/check-wheel.sh --update   install the newest versions the registry serves, check them, and
#                                          write them to the constraints file
# Uses the package registry that pip is configured for; the wheel and the environment go in a temporary
# folder, removed on exit (KEEP=1 keeps it).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"
constraints="${root}/deploy/image/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1

update=0
case "${1:-}" in
    "") ;;
    --update) update=1 ;;
    *) echo "usage: $0 [--update]" >&2; exit 2 ;;
esac
[[ -f "${constraints}" ]] || { echo "no constraints file ${constraints}" >&2; exit 2; }

work="$(mktemp -d)"
if [[ "${KEEP:-0}" == 1 ]]; then
    echo "keeping ${work}"
else
    trap 'rm -rf "${work}"' EXIT
fi
say() { printf -- '--> %s\n' "$*"; }

say "building the wheel"
python3 -m pip wheel -qq --no-deps --wheel-dir "${work}/dist" "${root}"
wheels=("${work}"/dist/gpuplane-*.whl)
[[ ${#wheels[@]} -eq 1 && -f "${wheels[0]}" ]] || { echo "expected one gpuplane wheel, got: ${wheels[*]}" >&2; exit 1; }
wheel="${wheels[0]}"
version="$(basename "${wheel}" | cut -d- -f2)"
say "$(basename "${wheel}")"

say "installing it into a fresh virtual environment"
python3 -m venv "${work}/venv"
venv="${work}/venv/bin"
if [[ ${update} -eq 1 ]]; then
    "${venv}/python" -m pip install -qq "${wheel}"
else
    # The pinned wheels are kept in a wheelhouse between runs (GPUPLANE_WHEELHOUSE, by default in the
    # user's cache): a run whose pins are all there installs without asking the registry; any other
    # run downloads what is missing first.
    wheelhouse="${GPUPLANE_WHEELHOUSE:-${XDG_CACHE_HOME:-${HOME}/.cache}/gpuplane/wheelhouse}"
    mkdir -p "${wheelhouse}"
    offline=("${venv}/python" -m pip install -qq --no-compile --no-index --find-links "${wheelhouse}" --constraint "${constraints}")
    if ! "${offline[@]}" "${wheel}" 2>/dev/null; then
        say "fetching the pinned wheels into ${wheelhouse}"
        "${venv}/python" -m pip download -qq --dest "${wheelhouse}" --constraint "${constraints}" "${wheel}"
        rm -f "${wheelhouse}"/gpuplane-*.whl  # the wheel under test is always the one just built
        "${offline[@]}" "${wheel}"
    fi
fi

say "checking the commands, the modules and the package data"
out="$("${venv}/gpuplane" --version)"
[[ "${out}" == "gpuplane ${version}" ]] || { echo "gpuplane --version printed '${out}', not 'gpuplane ${version}'" >&2; exit 1; }
out="$("${venv}/kubectl-gpuplane" version)"
[[ "${out}" == "kubectl-gpuplane (gpuplane ${version})" ]] || { echo "kubectl-gpuplane version printed '${out}'" >&2; exit 1; }
# Run from an empty folder, so that the installed package is imported, never the checkout's src/.
(cd "${work}" && "${venv}/python" - "${root}/src/gpuplane" <<'EOF'
import importlib
import pkgutil
import sys
from pathlib import Path

import gpuplane

source = Path(sys.argv[1])
installed = Path(gpuplane.__file__).parent
assert source.resolve() != installed.resolve(), "the checkout was imported, not the wheel"


def shipped(top: Path) -> set[str]:
    return {
        str(p.relative_to(top))
        for p in top.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


missing = sorted(shipped(source) - shipped(installed))
if missing:
    sys.exit("the wheel lacks these files of src/gpuplane: " + ", ".join(missing))
# A __main__ module runs its command when imported: it is checked by running the commands above.
modules = [m.name for m in pkgutil.walk_packages(gpuplane.__path__, "gpuplane.") if not m.name.endswith(".__main__")]
for name in modules:
    importlib.import_module(name)
data = sorted(f for f in shipped(installed) if not f.endswith(".py"))
print(f"{len(modules)} modules import; package data present: {', '.join(data)}")
EOF
)

say "checking the installed versions against $(basename "${constraints}")"
"${venv}/python" -m pip freeze --exclude gpuplane | LC_ALL=C sort > "${work}/installed.txt"
if [[ ${update} -eq 1 ]]; then
    {
        sed -n '/^#/p' "${constraints}"
        cat "${work}/installed.txt"
    } > "${work}/constraints.txt"
    mv "${work}/constraints.txt" "${constraints}"
    say "wrote $(grep -vc '^#' "${constraints}") pins to ${constraints}"
    exit 0
fi
grep -v '^#' "${constraints}" | sed '/^$/d' | LC_ALL=C sort > "${work}/pinned.txt"
if ! diff -u "${work}/pinned.txt" "${work}/installed.txt" > "${work}/pins.diff"; then
    echo "the fresh environment does not hold exactly the pinned versions (- pinned, + installed):" >&2
    cat "${work}/pins.diff" >&2
    echo "pin every dependency in ${constraints} (scripts/check-wheel.sh --update rewrites it)" >&2
    exit 1
fi
say "the wheel installs with $(wc -l < "${work}/pinned.txt") pinned dependencies: ok"
