#!/usr/bin/env bash
# Two-worker L3 pool smoke test on a GPU machine with SGLang's CUDA build (sglang==0.5.23).
#
#   scripts/gpu_smoke.sh MODEL_PATH [GPU_A] [GPU_B]
#
# Starts worker A and worker B with `python -m sglang_patch.launch_server` (standalone: no router,
# pool only; both on this machine, sharing one shm pool), sends a long prompt to A, waits until its
# pages reached the pool (write-through), then sends the same prompt + a new turn to B and checks:
#   1. B reports L3 storage hits (meta_info.cached_tokens_details.storage > 0),
#   2. B's greedy output equals a cold run on B (a fresh cache_salt: every page recomputed).
# (bf16 GPU kernels may round a cached-prefix prefill differently from a full one; a mismatch
# there is reported with both texts - compare against a second warm run to tell them apart.)
# Exit 0 = pass. Logs: $OUT_DIR (default ./gpu_smoke_logs). Every process started is stopped.
# Needs: python with sglang 0.5.23 (CUDA), this repo importable (run from the repo root), curl.
set -euo pipefail

MODEL=${1:?usage: scripts/gpu_smoke.sh MODEL_PATH [GPU_A] [GPU_B]}
GPU_A=${2:-0}
GPU_B=${3:-${GPU_A}}
PY=${PYTHON:-python}
OUT_DIR=${OUT_DIR:-./gpu_smoke_logs}
POOL_ID="gpu-smoke-$$"
PORT_A=${PORT_A:-30100}
PORT_B=${PORT_B:-30101}
MEM_FRACTION=${MEM_FRACTION:-0.35}   # both workers may share one GPU
mkdir -p "$OUT_DIR"
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"

PIDS=()
cleanup() {
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 5
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "/dev/shm/radix-global/$POOL_ID"
}
trap cleanup EXIT INT TERM

start_worker() {  # name gpu port
  CUDA_VISIBLE_DEVICES=$2 "$PY" -m sglang_patch.launch_server \
    --model-path "$MODEL" --host 127.0.0.1 --port "$3" \
    --page-size 16 --mem-fraction-static "$MEM_FRACTION" \
    --hicache-ratio 2 --hicache-storage-prefetch-policy wait_complete \
    --radix-global-pool-id "$POOL_ID" --radix-global-pool-capacity-gb 8 \
    >"$OUT_DIR/$1.log" 2>&1 &
  PIDS+=($!)
}

wait_healthy() {  # port name
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$1/health" >/dev/null; then return 0; fi
    sleep 1
  done
  echo "worker $2 not healthy; see $OUT_DIR/$2.log" >&2
  tail -50 "$OUT_DIR/$2.log" >&2
  return 1
}

start_worker A "$GPU_A" "$PORT_A"
start_worker B "$GPU_B" "$PORT_B"
wait_healthy "$PORT_A" A
wait_healthy "$PORT_B" B

"$PY" - "$PORT_A" "$PORT_B" "$POOL_ID" <<'EOF'
import json, sys, time, urllib.request

port_a, port_b, pool_id = sys.argv[1], sys.argv[2], sys.argv[3]

def post(port, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read() or b"{}")

def gen(port, text):
    return post(port, "/generate", {"text": text,
                "sampling_params": {"max_new_tokens": 32, "temperature": 0.0}})

prefix = " ".join(f"Paragraph {i}: the quick brown fox number {i * 7919 % 1000} jumps."
                  for i in range(400))  # a few thousand tokens
turn = prefix + " Question: which number came after paragraph 17?"

from sglang_patch.pool.shm_pool import ShmPagePool
gen(port_a, prefix)
deadline = time.time() + 120
while True:
    try:
        pages = ShmPagePool.open_existing(pool_id).stats().pages
    except Exception:
        pages = 0
    if pages > 50 or time.time() > deadline:
        break
    time.sleep(1)
print(f"pool pages after A: {pages}")
warm = gen(port_b, turn)
storage = (warm["meta_info"].get("cached_tokens_details") or {}).get("storage") or 0
print(f"B storage-cached tokens: {storage} of {warm['meta_info']['prompt_tokens']}")
assert storage > 0, f"B served nothing from the pool: {warm['meta_info']}"

# cold reference on B: a fresh cache_salt makes every page key new (no radix, host or pool hit),
# so the same tokens are recomputed from scratch.
cold = post(port_b, "/generate", {"text": turn, "cache_salt": f"cold-{time.time()}",
            "sampling_params": {"max_new_tokens": 32, "temperature": 0.0}})
print(f"cold run cached tokens: {cold['meta_info'].get('cached_tokens')}")
assert not cold["meta_info"].get("cached_tokens"), "the cold run hit a cache"
same = warm.get("output_ids", warm["text"]) == cold.get("output_ids", cold["text"])
print("warm == cold:", same)
assert same, (warm.get("text"), cold.get("text"))
print("GPU SMOKE PASS")
EOF
