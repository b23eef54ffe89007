#!/usr/bin/env bash
# Tessera on a real NVIDIA GPU (any model): NVML discovery against nvidia-smi, `tessera up --gpus auto`, two 0.25
# shares on one GPU, the NVML memory watchdog stopping a hog, the DCGM-named metrics, MPS detection, a
# transformers-serve replica through the gateway. What Tessera should report comes from nvidia-smi. See README.md here.
#
#   bash scripts/gpu_check/gpu_check.sh     # on the GPU machine ($OUT: where results go; BUNDLE: see bundle.sh)
#   SIM=1 PY=.venv/bin/python MODEL_PY=.venv-vllm/bin/python OUT=/tmp/o bash scripts/gpu_check/gpu_check.sh  # simulated
#
# Each step is time-boxed and the script goes on after a failed one; $OUT gets gpu_check.log, summary.json,
# server_log_tail.txt, workload_logs.txt, nvidia_smi.txt and metrics.txt. It exits 0 whatever the checks say:
# summary.json's "failed" lists the failed checks.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/gpu-check-out}
SIM=${SIM:-0}
SIM_GPUS=${SIM_GPUS:-1xH100-80GB}   # the simulated pool under SIM=1
MODEL=${MODEL:-1}              # MODEL=0 leaves out the transformers-serve replica step
PY=${PY:-python3}
PY=$(command -v "$PY")
WORK=${WORK:-/tmp/gpu-check-work}
SITE=${SITE:-/tmp/site}
BUNDLE=${BUNDLE:-$HERE/bundle}  # whl/*.whl and scipy-*-notests.tar.xz, made by bundle.sh; absent: nothing installed
BUDGET=${BUDGET:-300}          # seconds for every step before the cleanup
RUN_AS=${RUN_AS:-server}       # --run-as for tessera up (server: the workloads run as root, like the server)
PORT=${PORT:-18470}
START=$(date +%s)
mkdir -p "$OUT"
rm -rf "$WORK"; mkdir -p "$WORK"
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
export OUT SIM SIM_GPUS PY WORK
SERVER_PID=""

note() { echo "$(date +%H:%M:%S) == $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
tb() { local want=$1 l; l=$(left); (( l < want )) && want=$l; (( want < 5 )) && want=5; echo "$want"; }
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$WORK/results.tsv"; echo "RESULT $1: ${2^^} $3"; }
# step NAME SECONDS: python check.py NAME under timeout (the time left in the budget at most)
step() {
    local name=$1 secs; secs=$(tb "$2"); note "step $name (at most ${secs}s; $(left)s of the budget left)"
    timeout -k 5 "$secs" "$PY" "$HERE/check.py" "$name"; local rc=$?
    if (( rc == 124 || rc == 137 )); then result "$name" fail "step timed out after ${secs}s";
    elif (( rc != 0 )); then result "$name" fail "step crashed (exit $rc); see gpu_check.log"; fi
    return 0
}

note "host $(cat /proc/sys/kernel/hostname), $(date -u), SIM=$SIM, PY=$PY ($("$PY" --version 2>&1)), OUT=$OUT, WORK=$WORK"
if [[ $SIM != 1 ]]; then
    note "nvidia-smi"
    { timeout 20 nvidia-smi -L; timeout 20 nvidia-smi; timeout 20 nvidia-smi -q -d MEMORY,COMPUTE; } > "$OUT/nvidia_smi.txt" 2>&1
    head -40 "$OUT/nvidia_smi.txt"
    timeout 20 nvidia-smi --query-gpu=driver_version,name,uuid,memory.total,mig.mode.current,compute_mode \
        --format=csv 2>&1 || result nvidia_smi fail "nvidia-smi failed"
    note "PID namespace: $(readlink /proc/self/ns/pid); pid 1: $(tr '\0' ' ' < /proc/1/cmdline | cut -c1-80)"
fi

# -- the bundle (bundle.sh): wheels Tessera needs that the image lacks, and scipy (tests stripped) as a tarball
# scipy without its tests, as a tar.xz (35 MB as a wheel, 19 MB so); Python's tarfile where tar has no xz
untar_scipy() {
    timeout 60 tar -xJf "$BUNDLE"/scipy-*.tar.xz -C "$SITE" 2>/dev/null \
        || timeout 90 "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
            "$(ls "$BUNDLE"/scipy-*.tar.xz)" "$SITE"
}
INSTALL=${INSTALL:-1}
if [[ -d "$BUNDLE/whl" && $INSTALL == 1 ]]; then
    note "installing the bundle into $SITE"
    t0=$(date +%s)
    if timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
            "$BUNDLE"/whl/*.whl \
        && untar_scipy; then
        result bundle.install ok "$(ls "$BUNDLE"/whl | wc -l) wheels + scipy in $(( $(date +%s) - t0 ))s"
    else
        result bundle.install fail "pip install --target $SITE failed; unpacking the wheels with zipfile instead"
        for w in "$BUNDLE"/whl/*.whl; do timeout 60 "$PY" -m zipfile -e "$w" "$SITE"; done
        untar_scipy
    fi
    export PYTHONPATH="$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="${PYTHONPATH:-$ROOT/src}"
case ":$PYTHONPATH:" in *":$ROOT/src:"*) ;; *) export PYTHONPATH="$PYTHONPATH:$ROOT/src" ;; esac
note "PYTHONPATH=$PYTHONPATH LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-<unset>} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<unset>}"
ldconfig -p 2>/dev/null | grep -m2 libcuda.so || echo "libcuda.so not in the ldconfig cache"
"$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|transformers|nvidia-ml-py|numpy|numba|typer|click|rich|httpx|tokenizers|huggingface.hub|safetensors|accelerate|scipy) " | tr -s ' ' | paste -sd ';'

# The engines' interpreter: Tessera strips PYTHONPATH from a real engine's environment (an engine's virtualenv is
# self-contained); here the serve dependencies are in $SITE, so the "virtualenv" is a wrapper that adds it.
if [[ -n "${MODEL_PY:-}" ]]; then ENGINE_PY=$(command -v "$MODEL_PY"); else
    ENGINE_PY="$WORK/engine-python"
    {
        printf '#!/bin/sh\nexport PYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH}\n' "$SITE"
        [[ -n "${LD_LIBRARY_PATH:-}" ]] && printf 'export LD_LIBRARY_PATH=%s\n' "$LD_LIBRARY_PATH"
        printf 'exec %s "$@"\n' "$PY"
    } > "$ENGINE_PY"
    chmod 755 "$ENGINE_PY"; cat "$ENGINE_PY"
    export MODEL_PY="$ENGINE_PY" ENGINE_PYTHONPATH="$SITE"
fi
export MODEL_PY

step imports 60
step torch 60
step discover 30
step mps 10

# -- tessera up
TOKEN="tsr_$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')"
export TESSERA_URL="http://127.0.0.1:$PORT" TESSERA_TOKEN="$TOKEN"
SETSID=$(command -v setsid || true)   # its own process group, to stop it whole; without setsid, by its pid
GPUS=auto; [[ $SIM == 1 ]] && GPUS=$SIM_GPUS
note "tessera up --gpus $GPUS --run-as $RUN_AS on 127.0.0.1:$PORT"
TESSERA_ADMIN_TOKEN="$TOKEN" TESSERA_ENGINE_PYTHON="$ENGINE_PY" TESSERA_URL= TESSERA_TOKEN= \
    $SETSID "$PY" -m tessera.cli up --host 127.0.0.1 --port "$PORT" --gpus "$GPUS" --data-dir "$WORK/data" \
    --run-as "$RUN_AS" > "$WORK/server.log" 2>&1 < /dev/null &
SERVER_PID=$!
healthy=0
for _ in $(seq 1 "$(tb 60)"); do
    if "$PY" -c "import httpx,sys; r=httpx.get('$TESSERA_URL/healthz', timeout=2); sys.exit(r.status_code != 200)" \
        2>/dev/null; then healthy=1; break; fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 1
done
head -30 "$WORK/server.log"
if (( healthy )); then
    result up.healthy ok "after $(( $(date +%s) - START ))s since the script began"
    step nodes 30
    step shares 100
    step watchdog 70
    step metrics 20
    step cancel_shares 40
    if [[ $MODEL == 1 ]]; then step model 200; else result model skip "MODEL=0"; fi
else
    result up.healthy fail "no /healthz 200; server alive: $(kill -0 "$SERVER_PID" 2>/dev/null && echo yes || echo no)"
fi

# -- always: stop what was started
note "cleanup"
if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    timeout 45 "$PY" "$HERE/check.py" cleanup
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 1 15); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        result server.stop fail "still alive 15s after SIGTERM; SIGKILL"; kill -KILL -- "-$SERVER_PID" 2>/dev/null
    else
        wait "$SERVER_PID"; result server.stop ok "exit $?"
    fi
fi
for f in "$WORK"/data/logs/*.log; do [[ -e $f ]] && { echo "=== $f"; tail -c 6000 "$f"; }; done > "$OUT/workload_logs.txt" 2>&1
# workloads outlive the server by design: kill, by process group, whatever has TESSERA_WORKLOAD_ID or names $WORK
timeout 30 "$PY" "$HERE/check.py" strays
[[ $SIM != 1 ]] && timeout 20 nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv >> "$OUT/nvidia_smi.txt" 2>&1
tail -c 400000 "$WORK/server.log" > "$OUT/server_log_tail.txt" 2>/dev/null
[[ -f "$WORK/metrics.txt" ]] && cp "$WORK/metrics.txt" "$OUT/metrics.txt"
"$PY" "$HERE/check.py" summary
ls -la "$OUT"
note "done in $(( $(date +%s) - START ))s"
exit 0
