#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python's (make test runs this before pytest; each is installed only
# when missing, with apt-get, through sudo when not root).
#
#   nvidia-cuda-mps   the MPS control daemon, to test that Tessera detects a live daemon by asking it. It lives in
#                     Debian's non-free component, which is added to apt's sources (deb822 file
#                     /etc/apt/sources.list.d/tessera-nonfree.sources) when no source offers the package. The daemon
#                     starts without a GPU.
#   chromium          the browser of the dashboard's tests (tests/server/test_e2e_dashboard.py), which Playwright drives
#                     at /usr/bin/chromium: Playwright downloads no browser of its own.
#
# A package that cannot be installed (no network, no root) is reported in one warning line; the tests that need it
# then skip and say why. Exit code 0 either way: this script never fails the build on its own.
set -uo pipefail

PROG=test-packages.sh
NONFREE=/etc/apt/sources.list.d/tessera-nonfree.sources

warn() { echo "$PROG: warning: $*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi
}

has_candidate() { apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [0-9]'; }

add_nonfree() {
    local suite
    suite=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [ -n "$suite" ] || return 1
    as_root tee "$NONFREE" >/dev/null <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: $suite $suite-updates
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
}

install_mps() {
    command -v nvidia-cuda-mps-control >/dev/null && return 0
    command -v apt-get >/dev/null || { warn "no apt-get: the MPS daemon test will skip"; return 0; }
    as_root apt-get update -qq >/dev/null 2>&1
    if ! has_candidate nvidia-cuda-mps; then
        add_nonfree && as_root apt-get update -qq >/dev/null 2>&1
    fi
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-cuda-mps >/dev/null 2>&1; then
        warn "could not install nvidia-cuda-mps: the MPS daemon test will skip"
    fi
}

install_chromium() {
    command -v chromium >/dev/null && return 0
    command -v apt-get >/dev/null || { warn "no apt-get: the dashboard's browser tests will skip"; return 0; }
    as_root apt-get update -qq >/dev/null 2>&1
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; then
        warn "could not install chromium: the dashboard's browser tests will skip"
    fi
}

install_mps
install_chromium

# prometheus        promtool, which tests/server/test_monitoring_deploy.py runs on the shipped alert rules (check
#                   and unit tests) and configuration, and the Prometheus server that `make run PROMETHEUS=1` starts
#                   and the scrape test runs against the demo (Debian bookworm: 2.42).
install_prometheus() {
    command -v promtool >/dev/null && command -v prometheus >/dev/null && return 0
    command -v apt-get >/dev/null || { warn "no apt-get: the Prometheus rule and scrape tests will skip"; return 0; }
    as_root apt-get update -qq >/dev/null 2>&1
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
        >/dev/null 2>&1; then
        warn "could not install prometheus: the Prometheus rule and scrape tests will skip"
    fi
}

install_prometheus
exit 0
