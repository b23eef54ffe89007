#!/usr/bin/env bash
# `make run PROMETHEUS=1`: the demo control plane (tessera up --demo) with a local Prometheus scraping it.
#
#   deploy/prometheus/run-local.sh TESSERA PORT PROMETHEUS_PORT DATA_DIR [--config-only]
#
# Writes DATA_DIR/prometheus/: an admin token (admin-token, mode 0600, made once), prometheus.yml (this folder's
# template with that token file, the target 127.0.0.1:PORT, a 5 s scrape interval and alerts.yml) and the TSDB
# (data/). Prometheus listens on 127.0.0.1:PROMETHEUS_PORT and is stopped when tessera up stops (Ctrl-C).
# tessera up is given the token with --admin-token-file: an admin token it generated on an earlier start is revoked
# (use the one in the file). --config-only writes the files and exits (the tests check them with promtool).
set -euo pipefail

[ $# -ge 4 ] || { echo "usage: $0 TESSERA PORT PROMETHEUS_PORT DATA_DIR [--config-only]" >&2; exit 2; }
TESSERA=$1 PORT=$2 PROM_PORT=$3 DATA_DIR=$4 MODE=${5:-}
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mkdir -p "$DATA_DIR/prometheus" && cd "$DATA_DIR/prometheus" && pwd)
TOKEN=$DIR/admin-token

if [ ! -s "$TOKEN" ]; then
    (umask 077 && "${PYTHON:-python3}" -c 'import secrets; print("tsr_" + secrets.token_urlsafe(32))' >"$TOKEN")
fi
cp "$HERE/alerts.yml" "$DIR/alerts.yml"
sed -e "s|/etc/prometheus/tessera-admin-token|$TOKEN|" \
    -e "s|127.0.0.1:8470|127.0.0.1:$PORT|" \
    -e "s|scrape_interval: 15s|scrape_interval: 5s|" \
    "$HERE/prometheus.yml" >"$DIR/prometheus.yml"
[ "$MODE" = --config-only ] && exit 0

if ! command -v prometheus >/dev/null; then
    echo "run-local.sh: prometheus is not installed (Debian: apt-get install prometheus); config in $DIR" >&2
    exit 2
fi
prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$DIR/prometheus.log" 2>&1 &
PROM_PID=$!
trap 'kill "$PROM_PID" 2>/dev/null; wait "$PROM_PID" 2>/dev/null' EXIT
echo "Prometheus http://127.0.0.1:$PROM_PORT scrapes http://127.0.0.1:$PORT/metrics (admin token in $TOKEN," \
    "log in $DIR/prometheus.log); Grafana: import deploy/grafana/tessera.json"
"$TESSERA" up --demo --port "$PORT" --data-dir "$DATA_DIR" --admin-token-file "$TOKEN"
