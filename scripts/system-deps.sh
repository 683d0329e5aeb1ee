#!/usr/bin/env bash
# System packages the tests use: a Vulkan loader and Mesa's lavapipe, so the Vulkan
# backend trains for real on a machine without a GPU; iproute2 (`ip`, `tc`), so the
# DiLoCo fault tests put the shepherd and workers on network namespaces of their own;
# nftables (`nft`), with which they drop packets on a link (tc's tbf slows it); Open MPI
# and Slurm with munge, on which `pcp launch` runs for real (a one-node cluster that
# tests/test_launch_engines.py starts); podman with runc, and debootstrap for a base
# image without a registry, on which nox's container-cpu session builds and runs PCP's
# image. Without them (no apt-get, not root) those tests skip with the reason, except
# under CI (CI set), where this script fails instead.
set -euo pipefail
packages=(libvulkan1 mesa-vulkan-drivers iproute2 nftables openmpi-bin slurm-wlm munge
    podman runc debootstrap)
if dpkg -s "${packages[@]}" >/dev/null 2>&1; then
    exit 0
fi
cannot() {
    if [ -n "${CI:-}" ]; then echo "system-deps: $1; CI needs them" >&2; exit 1; fi
    echo "system-deps: $1; Vulkan device and network-namespace tests will skip" >&2
    exit 0
}
if ! command -v apt-get >/dev/null; then cannot "no apt-get"; fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then sudo="sudo"; else cannot "not root and no sudo"; fi
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
