#!/usr/bin/env bash
# The whole radix-global path on one GPU host: router, KV events, index, a pool fetch across two
# workers, output equal to a cold run. For SGLang's CUDA build (sglang==0.5.23, the [sglang] extra).
#
# NOT YET RUN ON A GPU: this project's machines have no GPU and CI never runs this script
# (tests/test_gpu_smoke_script.py only checks its syntax and that every flag it passes exists).
# Its logic passed once on CPU: the tiny model (build/tiny-llama), PAGE_SIZE=4 POOL_GB=0.2
# PROMPT_PARAGRAPHS=40 MAX_TOTAL_TOKENS=8192 and WORKER_EXTRA_ARGS="--device cpu
# --attention-backend torch_native --sampling-backend pytorch --disable-overlap-schedule
# --dtype float32" (about 3 minutes on 2 cores).
#
#   scripts/gpu_smoke.sh MODEL_PATH [GPU_A] [GPU_B]        (or MODEL_PATH=... scripts/gpu_smoke.sh)
#
# What it does:
#   1. starts the router (`radix-global router --policy conductor`, embedded index) and two
#      workers (`radix-global sglang ... --radix-global ROUTER`: the wrapper turns on SGLang's KV
#      events, HiCache write-through and our shm pool as its L3 backend) sharing one shm pool;
#   2. waits until both registered (/admin/workers) with KV-event endpoints and the pool;
#   3. sends prompt P through the router; whichever worker took it (header x-radix-worker) is
#      "first", and waits until P's pages are in the pool and in the router's index;
#   4. drains "first" (POST /admin/workers/ID/drain), sends P + a question through the router,
#      which must land on the other worker ("second"), and checks:
#        - x-radix-worker names "second", x-radix-fetch-tokens > 0 (the router's index saw P's
#          pages in the pool and planned the fetch),
#        - second's engine reports tokens loaded from storage
#          (meta_info.cached_tokens_details.storage > 0: the pool fetch across workers);
#   5. sends the same text directly to "second" under a fresh cache_salt (every page key new: no
#      radix, host or pool hit) and checks the greedy outputs are equal.
#      (bf16 kernels may round a cached-prefix prefill differently from a full one; on a mismatch
#      the script also reruns the text from second's own cache and says which one differs.)
# Every check prints a PASS:/FAIL: line; the last line is GPU SMOKE PASS or GPU SMOKE FAIL; exit 0
# only on PASS. Every process it starts is stopped on exit (its process group), the pool removed.
#
# Environment (defaults):
#   MODEL_PATH (arg 1)  model folder or HF id          GPU_A (arg 2, 0), GPU_B (arg 3, = GPU_A)
#   ROUTER_PORT 30080   PORT_A 30000   PORT_B 30001    OUT_DIR ./gpu_smoke_logs (logs)
#   RG_ROUTER, RG_WORKER  the radix-global command of the router's / workers' install
#                         (radix-global; e.g. ~/rg-router/bin/radix-global)
#   PYTHON              a python that imports this project's sglang_patch (python3; the repo root
#                       is put on its PYTHONPATH)
#   PAGE_SIZE 16  MEM_FRACTION 0.35 (both workers may share one GPU)  MAX_TOTAL_TOKENS 65536
#   HICACHE_RATIO 2  POOL_GB 4  PROMPT_PARAGRAPHS 200 (~3,000 tokens)  MAX_NEW_TOKENS 32
#   POLICY_OPTIONS compare_fetch_cost=false  (the conductor then plans a fetch whenever the pool
#                       holds the prefix, so x-radix-fetch-tokens proves what the index saw; on a
#                       GPU recomputing a short prompt may price below the fetch)
#   ROUTER_EXTRA_ARGS, WORKER_EXTRA_ARGS  more flags (split on spaces), e.g. "--tp 2"
#   START_TIMEOUT_S 900 (each worker to /health)  CHECK_TIMEOUT_S 180 (each wait of the checks)
# Needs: curl, setsid (util-linux), /dev/shm with POOL_GB free.
set -euo pipefail

MODEL=${MODEL_PATH:-${1:-}}
if [ -z "$MODEL" ]; then
  echo "usage: scripts/gpu_smoke.sh MODEL_PATH [GPU_A] [GPU_B]   (or MODEL_PATH=...)" >&2
  exit 2
fi
GPU_A=${GPU_A:-${2:-0}}
GPU_B=${GPU_B:-${3:-$GPU_A}}
ROUTER_PORT=${ROUTER_PORT:-30080}
PORT_A=${PORT_A:-30000}
PORT_B=${PORT_B:-30001}
OUT_DIR=${OUT_DIR:-./gpu_smoke_logs}
read -r -a RG_ROUTER_CMD <<<"${RG_ROUTER:-radix-global}"
read -r -a RG_WORKER_CMD <<<"${RG_WORKER:-radix-global}"
PY=${PYTHON:-python3}
PAGE_SIZE=${PAGE_SIZE:-16}
MEM_FRACTION=${MEM_FRACTION:-0.35}
MAX_TOTAL_TOKENS=${MAX_TOTAL_TOKENS:-65536}
HICACHE_RATIO=${HICACHE_RATIO:-2}
POOL_GB=${POOL_GB:-4}
POLICY_OPTIONS=${POLICY_OPTIONS:-compare_fetch_cost=false}
read -r -a ROUTER_EXTRA <<<"${ROUTER_EXTRA_ARGS:-}"
read -r -a WORKER_EXTRA <<<"${WORKER_EXTRA_ARGS:-}"
START_TIMEOUT_S=${START_TIMEOUT_S:-900}
export CHECK_TIMEOUT_S=${CHECK_TIMEOUT_S:-180}
export PROMPT_PARAGRAPHS=${PROMPT_PARAGRAPHS:-200}
export MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-32}
export ROUTER_PORT PORT_A PORT_B PAGE_SIZE
export POOL_ID="gpu-smoke-$$"
export ADMIN_TOKEN="gpu-smoke-$$-$RANDOM$RANDOM"
export WORKER_A_ID="gpu-smoke-a"
export WORKER_B_ID="gpu-smoke-b"
ROUTER_URL="http://127.0.0.1:$ROUTER_PORT"
POOL_DIR="/dev/shm/radix-global/$POOL_ID"
mkdir -p "$OUT_DIR"

fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "PASS: $*"; }

# --- processes: each in its own process group, stopped as a group ------------------------------
SETSID=()
if command -v setsid >/dev/null; then SETSID=(setsid); fi
PIDS=()  # stopped in this order: the newest first (workers deregister, then the router)
started() { PIDS=("$1" ${PIDS[@]+"${PIDS[@]}"}); }
stop_all() {
  local pid target i
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] || continue
    target=$pid; [ ${#SETSID[@]} -gt 0 ] && target=-$pid
    kill -TERM -- "$target" 2>/dev/null || true
    for i in $(seq 1 40); do kill -0 -- "$target" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "$target" 2>/dev/null || true
  done
  PIDS=()
}
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  stop_all
  [ -n "$POOL_ID" ] && rm -rf -- "$POOL_DIR"
  if [ "$rc" -eq 0 ]; then echo "GPU SMOKE PASS"; else
    echo "GPU SMOKE FAIL (exit $rc; logs in $OUT_DIR)"; fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- pre-flight ------------------------------------------------------------------------------
command -v curl >/dev/null || fail "curl not found"
"${RG_ROUTER_CMD[@]}" router --help >/dev/null 2>&1 || fail "'${RG_ROUTER_CMD[*]} router' does not run (set RG_ROUTER)"
"${RG_WORKER_CMD[@]}" sglang --help >/dev/null 2>&1 || fail "'${RG_WORKER_CMD[*]} sglang' does not run (set RG_WORKER)"
PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'import sglang_patch.pool.shm_pool' \
  || fail "$PY cannot import sglang_patch (run from the repo root, or set PYTHON)"
for port in "$ROUTER_PORT" "$PORT_A" "$PORT_B"; do
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; then
    fail "port $port is already in use (set ROUTER_PORT / PORT_A / PORT_B)"
  fi
done
shm_free_kb=$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')
awk -v free="$shm_free_kb" -v gb="$POOL_GB" 'BEGIN {exit !(free >= gb * 1024 * 1024)}' \
  || fail "/dev/shm has ${shm_free_kb} KiB free, the pool needs POOL_GB=$POOL_GB GiB (lower POOL_GB, or docker run --shm-size)"
pass "pre-flight (ports free, /dev/shm room, commands found)"

# --- the router ------------------------------------------------------------------------------
ROUTER_ARGS=(
  --host 127.0.0.1
  --port "$ROUTER_PORT"
  --policy conductor
  --policy-options "$POLICY_OPTIONS"
  --admin-token "$ADMIN_TOKEN"
  --heartbeat-timeout-s 30
)
${SETSID[@]+"${SETSID[@]}"} "${RG_ROUTER_CMD[@]}" router "${ROUTER_ARGS[@]}" \
  ${ROUTER_EXTRA[@]+"${ROUTER_EXTRA[@]}"} >"$OUT_DIR/router.log" 2>&1 &
ROUTER_PID=$!
started "$ROUTER_PID"

wait_healthy() {  # name pid url timeout_s [up: any HTTP answer will do]
  local deadline=$((SECONDS + $4)) code
  while [ "$SECONDS" -lt "$deadline" ]; do
    if ! kill -0 "$2" 2>/dev/null; then
      tail -50 "$OUT_DIR/$1.log" >&2 || true
      fail "$1 exited before it was healthy; see $OUT_DIR/$1.log"
    fi
    code=$(curl -s -o /dev/null --max-time 5 -w '%{http_code}' "$3/health" || true)
    if [ "$code" = 200 ] || { [ -n "${5:-}" ] && [ "$code" != 000 ]; }; then
      pass "$1 ${5:-healthy}"; return 0
    fi
    sleep 2
  done
  tail -50 "$OUT_DIR/$1.log" >&2 || true
  fail "$1 not healthy within $4 s; see $OUT_DIR/$1.log"
}
wait_healthy router "$ROUTER_PID" "$ROUTER_URL" 120 up  # 503 until a worker joins

# --- two workers on one shm pool, joined to the router ----------------------------------------
start_worker() {  # id gpu port
  WORKER_ARGS=(
    --model-path "$MODEL"
    --host 127.0.0.1
    --port "$3"
    --page-size "$PAGE_SIZE"
    --mem-fraction-static "$MEM_FRACTION"
    --max-total-tokens "$MAX_TOTAL_TOKENS"
    --hicache-ratio "$HICACHE_RATIO"
    --radix-global "$ROUTER_URL"
    --radix-global-admin-token "$ADMIN_TOKEN"
    --radix-global-worker-id "$1"
    --radix-global-pool-id "$POOL_ID"
    --radix-global-pool-capacity-gb "$POOL_GB"
    --radix-global-heartbeat-interval-s 2
  )
  CUDA_VISIBLE_DEVICES=$2 ${SETSID[@]+"${SETSID[@]}"} "${RG_WORKER_CMD[@]}" sglang "${WORKER_ARGS[@]}" \
    ${WORKER_EXTRA[@]+"${WORKER_EXTRA[@]}"} >"$OUT_DIR/$1.log" 2>&1 &
  WORKER_PID=$!
  started "$WORKER_PID"
}
start_worker "$WORKER_A_ID" "$GPU_A" "$PORT_A"; PID_A=$WORKER_PID
start_worker "$WORKER_B_ID" "$GPU_B" "$PORT_B"; PID_B=$WORKER_PID
wait_healthy "$WORKER_A_ID" "$PID_A" "http://127.0.0.1:$PORT_A" "$START_TIMEOUT_S"
wait_healthy "$WORKER_B_ID" "$PID_B" "http://127.0.0.1:$PORT_B" "$START_TIMEOUT_S"

# --- the checks ------------------------------------------------------------------------------
PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'EOF'
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid

E = os.environ
ROUTER = f"http://127.0.0.1:{E['ROUTER_PORT']}"
URLS = {E["WORKER_A_ID"]: f"http://127.0.0.1:{E['PORT_A']}",
        E["WORKER_B_ID"]: f"http://127.0.0.1:{E['PORT_B']}"}
TOKEN, POOL_ID, PAGE = E["ADMIN_TOKEN"], E["POOL_ID"], int(E["PAGE_SIZE"])
WAIT_S, NEW = float(E["CHECK_TIMEOUT_S"]), int(E["MAX_NEW_TOKENS"])
failures: list[str] = []


def check(ok, what, detail=""):
    print(("PASS: " if ok else "FAIL: ") + what + (f" [{detail}]" if detail else ""), flush=True)
    if not ok:
        failures.append(what)
    return ok


def must(ok, what, detail=""):
    if not check(ok, what, detail):
        sys.exit(1)


def call(method, url, body=None, admin=False, timeout=600):
    headers = {"Content-Type": "application/json"}
    if admin:
        headers["Authorization"] = f"Bearer {TOKEN}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}"), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"FAIL: {method} {url} answered {exc.code}: {exc.read()[:500]!r}")


def generate(base, text, **extra):
    body = {"text": text, "sampling_params": {"max_new_tokens": NEW, "temperature": 0.0},
            **extra}
    return call("POST", base + "/generate", body)


def meta(out):
    return out.get("meta_info") or {}


def storage(out):
    return int((meta(out).get("cached_tokens_details") or {}).get("storage") or 0)


def output(out):
    return out["output_ids"] if "output_ids" in out else out.get("text")


def wait_for(cond, what, timeout=WAIT_S, poll=1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll)


def workers():
    return {w["worker_id"]: w for w in call("GET", ROUTER + "/admin/workers", admin=True)[0]
            ["workers"]}


def router_stats():
    return call("GET", ROUTER + "/admin/stats", admin=True)[0]


def pool_pages():
    from sglang_patch.pool.shm_pool import ShmPagePool
    try:
        pool = ShmPagePool.open_existing(POOL_ID)
    except Exception:
        return 0
    try:
        return pool.stats().pages
    finally:
        pool.close()


# 1. Both workers registered, with their KV events and the shared pool.
wait_for(lambda: set(URLS) <= set(workers()), "registration")
ws = workers()
must(set(URLS) <= set(ws), "both workers registered with the router", f"registered: {sorted(ws)}")
for wid in URLS:
    w = ws[wid]
    must(bool(w.get("kv_events_endpoint")) and w.get("pool_id") == POOL_ID,
         f"{wid} registered KV events and pool {POOL_ID}",
         f"kv_events_endpoint={w.get('kv_events_endpoint')} pool_id={w.get('pool_id')}")
# The router profiles each new worker's prefill with requests of its own: let that finish first.
done = wait_for(lambda: router_stats().get("profiling_pending", 0) == 0, "profiling", 300)
if not done:
    print("INFO: the router is still profiling a worker; going on", flush=True)

# 2. Prompt P through the router: whichever worker takes it is "first".
nonce = uuid.uuid4().hex[:12]
prefix = f"Smoke test {nonce}. " + " ".join(
    f"Paragraph {i}: the quick brown fox number {i * 7919 % 1000} jumps." for i in
    range(int(E["PROMPT_PARAGRAPHS"])))
turn = prefix + " Question: which number came after paragraph 17?"
index_before = int(router_stats()["index"].get("pages", 0))
pool_before = pool_pages()
out1, hdr1 = generate(ROUTER, prefix)
first = hdr1.get("x-radix-worker")
must(first in URLS, "P routed to a worker through the router", f"x-radix-worker={first}")
second = next(w for w in URLS if w != first)
n_pages = int(meta(out1).get("prompt_tokens", 0)) // PAGE
print(f"INFO: P is {meta(out1).get('prompt_tokens')} tokens ({n_pages} pages), went to {first}, "
      f"cached {meta(out1).get('cached_tokens')}", flush=True)
want = max(1, n_pages - 2)
got = wait_for(lambda: pool_pages() - pool_before >= want, "pool pages")
check(bool(got), f"{first}'s pages of P reached the shared pool (write-through)",
      f"{pool_pages() - pool_before} new pool pages, want >= {want}")
got = wait_for(lambda: int(router_stats()["index"].get("pages", 0)) - index_before >= want,
               "index pages")
check(bool(got), "the router's index holds P's pages (KV events arrived)",
      f"{int(router_stats()['index'].get('pages', 0)) - index_before} new index pages, "
      f"want >= {want}")
time.sleep(3)  # the pool's own events (tier POOL) trail the engine's by a moment

# 3. Drain "first": the same prefix + a question must go to "second" and come from the pool.
call("POST", f"{ROUTER}/admin/workers/{first}/drain", {}, admin=True)
must(workers()[first].get("draining") is True, f"{first} drained")
out2, hdr2 = generate(ROUTER, turn)
print(f"INFO: second request headers: "
      f"{ {k: v for k, v in hdr2.items() if k.startswith('x-radix-')} }", flush=True)
check(hdr2.get("x-radix-worker") == second, f"P + question routed to {second}",
      f"x-radix-worker={hdr2.get('x-radix-worker')}")
check(int(hdr2.get("x-radix-fetch-tokens") or 0) > 0,
      "the router planned a pool fetch (its index saw P's pages in the pool)",
      f"x-radix-fetch-tokens={hdr2.get('x-radix-fetch-tokens')} "
      f"x-radix-prefix-tokens={hdr2.get('x-radix-prefix-tokens')}")
check(storage(out2) > 0, f"{second} loaded P from the pool (cached_tokens_details.storage > 0)",
      f"storage {storage(out2)} of {meta(out2).get('prompt_tokens')} prompt tokens, "
      f"cached {meta(out2).get('cached_tokens')}")

# 4. Cold reference on "second": a fresh cache_salt makes every page key new.
cold, _ = generate(URLS[second], turn, cache_salt=f"cold-{uuid.uuid4().hex}")
check(not meta(cold).get("cached_tokens"), "the cold run hit no cache",
      f"cached {meta(cold).get('cached_tokens')}")
same = output(out2) == output(cold)
if not check(same, "the pool-served output equals the cold run (greedy)"):
    print(f"  warm: {out2.get('text')!r}\n  cold: {cold.get('text')!r}", flush=True)
    local, _ = generate(URLS[second], turn)  # from second's own cache now, no pool involved
    if output(local) == output(out2):
        print("  a rerun from the worker's own cache gives the pool-served output too: the "
              "difference is the cached-prefix prefill's rounding (bf16 kernels), not pool data",
              flush=True)
    else:
        print("  a rerun from the worker's own cache differs from the pool-served output: "
              "suspect the pool's pages", flush=True)

for finding in call("GET", ROUTER + "/admin/diagnostics", admin=True)[0].get("findings", []):
    print(f"INFO: router diagnostic: {finding}", flush=True)
sys.exit(1 if failures else 0)
EOF
