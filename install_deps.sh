#!/usr/bin/env bash
# Installs every build and run dependency of asyncps from Debian's archive;
# with --test-beds also the test beds (TEST_PKGS). Idempotent: packages
# already present are skipped, so it is cheap to call from the README
# commands and from run_tests.sh. Needs root (or sudo).
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build lld pkg-config git
  libzmq3-dev cppzmq-dev
  capnproto libcapnp-dev
  librocksdb-dev
  libgflags-dev libgoogle-glog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev zlib1g-dev
  libcpp-httplib-dev nlohmann-json3-dev prometheus
  # Replica authentication and etcd over TLS; openssl makes psrun's etcd
  # certificates.
  libssl-dev openssl
  # etcd holds shard membership and the layout (common/etcd_client.h).
  etcd-server etcd-client
  dataset-fashion-mnist
  gnuplot-nox python3 procps iproute2
  # The Python package (worker/python): built for Debian's python3, which
  # imports Debian's PyTorch (CPU) and numpy; tests run with pytest.
  python3-dev pybind11-dev python3-numpy python3-torch python3-pytest
  # pip install . (setup.py, --no-build-isolation) and cpack -G DEB, whose
  # Depends: dpkg-shlibdeps (dpkg-dev) computes; tests/packaging uses both.
  python3-setuptools python3-wheel python3-pip python3-venv dpkg-dev
  # Static checks in CI: Clang's thread-safety analysis and the
  # .clang-format check of every C++ source (tests/static/).
  clang clang-format
)
# Test beds, not dependencies of asyncps: tests/launch/ssh_test.py and
# slurm_real_test.py start a private sshd, munged, slurmctld and slurmd on
# 127.0.0.1 (by PID; nothing is started by installing) and run real fleets
# through psrun's SSH and Slurm backends. run_tests.sh passes --test-beds.
TEST_PKGS=(openssh-server openssh-client slurmctld slurmd slurm-client munge)
case "${1:-}" in
  "") ;;
  --test-beds) PKGS+=("${TEST_PKGS[@]}") ;;
  *) echo "usage: $0 [--test-beds]" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
