#!/usr/bin/env bash
# The GPU check's wheel bundle, for a GPU machine that has no package index: the wheels Tessera's control plane and
# the transformers-serve replica need that such an image (torch, transformers, numpy, numba, httpx, uvloop,
# prometheus-client, rich, typer, click, psutil, requests, nvidia-ml-py, pyyaml) lacks, and scipy without its tests.
#
#   bash scripts/gpu_check/bundle.sh [DEST]      # DEST: default scripts/gpu_check/bundle (git-ignored)
#
# Versions are those of the project's tested environment: `pip freeze` of .venv (make lint or make test creates
# it); accelerate, which only the engines use, from .venv-vllm (scripts/engines.sh), else ACCELERATE (1.15.0).
# Wheels are fetched with `pip download --no-deps --only-binary=:all:` for CPython $PYVER on x86_64 manylinux, through
# pip's configured index. scipy (core/gap_prices imports it, so `tessera up` needs it) goes in as a tar.xz of the
# unpacked wheel without its tests folders: about 19 MB instead of 35 MB, so that the bundle and the repository
# fit the device machine's 64 MiB carry. gpu_check.sh installs both into $SITE (pip --target, else zipfile/tarfile).
# Send it with the working tree: run(carry=["scripts/gpu_check/bundle"], command="bash scripts/gpu_check/gpu_check.sh").
set -euo pipefail
cd "$(dirname "$0")/../.."

DEST=${1:-scripts/gpu_check/bundle}
VENV=${VENV:-.venv}
ENGINE_VENV=${ENGINE_VENV:-.venv-vllm}
PYVER=${PYVER:-3.12}
ACCELERATE=${ACCELERATE:-1.15.0}
PIP=${PIP:-python3 -m pip}
# The image's missing packages (pip names). The CLI stack (typer, click, rich, httpx ...) is pinned to the tested
# versions even where the image has its own.
PACKAGES="fastapi opentelemetry-api starlette pydantic pydantic_core annotated-types annotated-doc typing-inspection
uvicorn httptools sqlalchemy greenlet alembic mako markupsafe fastapi_offline
openai httpx2 httpcore2 jiter truststore sniffio
typer click rich shellingham markdown-it-py mdurl httpx httpcore h11 anyio idna typing_extensions"

test -x "$VENV/bin/python" || { echo "bundle.sh: no $VENV (make lint creates it); its pip freeze gives the versions" >&2; exit 1; }
freeze=$("$VENV/bin/python" -m pip freeze --all 2>/dev/null)
norm() { echo "$1" | tr '[:upper:]_.' '[:lower:]--'; }
version_of() {  # version_of NAME: the pinned version in $freeze (names compared normalised, as pip does)
    local want; want=$(norm "$1")
    while IFS= read -r line; do
        [[ $line == *==* ]] || continue
        if [[ $(norm "${line%%==*}") == "$want" ]]; then echo "${line#*==}"; return 0; fi
    done <<< "$freeze"
    return 1
}
if [[ -x "$ENGINE_VENV/bin/python" ]]; then
    ACCELERATE=$(freeze=$("$ENGINE_VENV/bin/python" -m pip freeze 2>/dev/null) && version_of accelerate || echo "$ACCELERATE")
fi

pins=("accelerate==$ACCELERATE")
for name in $PACKAGES; do
    v=$(version_of "$name") || { echo "bundle.sh: $name is not in $VENV's pip freeze" >&2; exit 1; }
    pins+=("$name==$v")
done
scipy=$(version_of scipy) || { echo "bundle.sh: scipy is not in $VENV's pip freeze" >&2; exit 1; }

platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
fetch() {  # fetch DIR PIN...: wheels only, no dependencies, for CPython $PYVER on x86_64 Linux
    local dir=$1; shift
    $PIP download --quiet --no-deps --only-binary=:all: --implementation cp --python-version "$PYVER" \
        "${platforms[@]}" --dest "$dir" "$@"
}

rm -rf "$DEST"; mkdir -p "$DEST/whl"
echo "bundle.sh: ${#pins[@]} wheels into $DEST/whl: ${pins[*]}"
fetch "$DEST/whl" "${pins[@]}"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fetch "$tmp/wheel" "scipy==$scipy"
mkdir -p "$tmp/unpacked"
python3 -m zipfile -e "$tmp"/wheel/scipy-*.whl "$tmp/unpacked"
find "$tmp/unpacked" -type d -name tests -prune -exec rm -rf {} +
py=${PYVER/./}
tar -cJf "$DEST/scipy-$scipy-cp$py-notests.tar.xz" -C "$tmp/unpacked" .
echo "bundle.sh: scipy $scipy without its tests: $DEST/scipy-$scipy-cp$py-notests.tar.xz"
ls "$DEST/whl" | wc -l | xargs echo "bundle.sh: wheels:"
du -sh "$DEST"
