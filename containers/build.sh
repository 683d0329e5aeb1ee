#!/usr/bin/env bash
# Build PCP's container image for one backend, from this checkout:
#
#   containers/build.sh cpu|cuda|cuda-iree|rocm [TAG]       (TAG default: pcp:BACKEND)
#
# cpu: the shepherd and CPU workers (jax and IREE's compiler, for `pcp train` and
# `pcp shepherd`); cuda: the xla backend on jax's CUDA wheels (run with the NVIDIA
# container toolkit: --device nvidia.com/gpu=all); cuda-iree: IREE's CUDA runtime;
# rocm: IREE's HIP runtime on AMD's ROCm base image (--device /dev/kfd --device /dev/dri).
# Environment: ENGINE (podman or docker; default: whichever is installed, podman first),
# BASE (another base image), WHEELS (a folder of wheels to use instead of building PCP's
# from this checkout, with their dependencies for an offline build: then PIP_ARGS=--no-index),
# PIP_ARGS, ENGINE_ARGS (more flags for the engine's build, e.g. --network none).
set -euo pipefail
backend=${1:?usage: containers/build.sh cpu|cuda|cuda-iree|rocm [TAG]}
tag=${2:-pcp:$backend}
root=$(cd "$(dirname "$0")/.." && pwd)
apt_packages=""
case $backend in
    cpu) base=docker.io/library/python:3.11-slim-bookworm; packages="pcp-core" ;;
    cuda) base=docker.io/library/python:3.11-slim-bookworm; packages="pcp-core pcp-xla[cuda]" ;;
    cuda-iree) base=docker.io/library/python:3.11-slim-bookworm; packages="pcp-core pcp-iree-cuda" ;;
    rocm)
        base=docker.io/rocm/dev-ubuntu-24.04:6.4
        packages="pcp-core pcp-iree-rocm"
        apt_packages="python3-venv"
        ;;
    *) echo "containers/build.sh: unknown backend '$backend' (cpu, cuda, cuda-iree, rocm)" >&2; exit 2 ;;
esac
engine=${ENGINE:-$(command -v podman || command -v docker || true)}
if [ -z "$engine" ]; then
    echo "containers/build.sh: neither podman nor docker is installed" >&2
    exit 2
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir "$context/wheels"
if [ -n "${WHEELS:-}" ]; then
    cp "$WHEELS"/*.whl "$context/wheels/"
else  # PCP's own packages, built from this checkout; the rest comes from PyPI
    python3 -m pip wheel --quiet --no-deps --wheel-dir "$context/wheels" \
        "$root" "$root"/plugins/pcp-*/
fi
cp "$root/containers/Containerfile" "$context/"
# shellcheck disable=SC2086  # ENGINE may hold flags, ENGINE_ARGS is a list of them
$engine build ${ENGINE_ARGS:-} --tag "$tag" \
    --build-arg "BASE=${BASE:-$base}" --build-arg "PACKAGES=$packages" \
    --build-arg "APT_PACKAGES=$apt_packages" --build-arg "PIP_ARGS=${PIP_ARGS:-}" \
    --file "$context/Containerfile" "$context"
echo "built $tag"
