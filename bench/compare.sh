#!/usr/bin/env bash
# Keel's benchmark against graphile-worker, on one throwaway PostgreSQL per repetition
# (PostgreSQL's defaults: fsync and synchronous_commit on), same database, same N and C.
# Prints one table: figure, Keel, peer, ratio (medians across repetitions). See
# docs/benchmarks.md.
#
#   bench/compare.sh [keel-bench run flags…]
#
# Environment: JOBS (20000), CONCURRENCY (16), SAMPLES (300), REPEAT (1), OUT (a new
# directory under /tmp; the JSON reports are kept there), PEER (../shared/bench/peers/
# graphile-worker), CARGO_TARGET_DIR (target). Extra arguments go to `keel-bench run`,
# for example `--figures queue` or `--hold-secs 10` for a short run.
#
# DB_DELAY_MS (unset): delays each way, in ms, space-separated (`DB_DELAY_MS="1 5"`). For
# each, both Keel and the peer measure the queue figures again through
# ../shared/bench/tools/delay-proxy.py in front of the same cluster (the remote-database
# rows, "remote database 1 ms: …"). REMOTE_JOBS (JOBS) is their N.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-20000}
CONCURRENCY=${CONCURRENCY:-16}
SAMPLES=${SAMPLES:-300}
REPEAT=${REPEAT:-1}
PEER=${PEER:-../shared/bench/peers/graphile-worker}
DB_DELAY_MS=${DB_DELAY_MS:-}
REMOTE_JOBS=${REMOTE_JOBS:-$JOBS}
PROXY=${PROXY:-../shared/bench/tools/delay-proxy.py}
OUT=${OUT:-$(mktemp -d /tmp/keel-bench.XXXXXX)}
mkdir -p "$OUT"
# The cluster runs as the `postgres` user when this runs as root: it must reach $OUT.
chmod 755 "$OUT"

echo "== building keel (release)" >&2
cargo build --release --quiet -p keel -p keel-bench
BENCH=$(realpath "${CARGO_TARGET_DIR:-target}")/release/keel-bench

echo "== installing the peer (shared/ is read-only: a copy under $OUT)" >&2
rm -rf "$OUT/peer"
cp -r "$PEER" "$OUT/peer"
chmod -R u+w "$OUT/peer"
(cd "$OUT/peer" && npm ci --silent --no-audit --no-fund)

pg=""
proxy=""
stop_proxy() {
  if [ -n "$proxy" ]; then kill "$proxy" 2>/dev/null || true; wait "$proxy" 2>/dev/null || true; proxy=""; fi
}
stop_postgres() {
  stop_proxy
  if [ -n "$pg" ]; then kill "$pg" 2>/dev/null || true; wait "$pg" 2>/dev/null || true; pg=""; fi
}
trap stop_postgres EXIT

# Both sides through the proxy at $1 ms each way: queue figures only.
remote() {
  local delay=$1 url=$2 i=$3 port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local target=${url#*@}
  target=${target%%/*}
  python3 "$PROXY" "$port" "${target%:*}" "${target##*:}" "$delay" &
  proxy=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  local far="${url%@*}@127.0.0.1:$port/${url##*/}"
  echo "== run $i: graphile-worker through a ${delay} ms proxy (N=$REMOTE_JOBS, C=$CONCURRENCY)" >&2
  DATABASE_URL="$far" node "$OUT/peer/bench.mjs" --jobs "$REMOTE_JOBS" --concurrency "$CONCURRENCY" \
    --samples "$SAMPLES" > "$OUT/peer-d$delay-$i.json"
  echo "== run $i: keel through a ${delay} ms proxy (N=$REMOTE_JOBS, C=$CONCURRENCY)" >&2
  RUST_LOG=${RUST_LOG:-warn,sqlx=error} "$BENCH" run --database-url "$far" --figures queue \
    --jobs "$REMOTE_JOBS" --concurrency "$CONCURRENCY" --samples "$SAMPLES" --db-delay-ms "$delay" \
    --out "$OUT/keel-d$delay-$i.json" > /dev/null
  stop_proxy
}

for i in $(seq 1 "$REPEAT"); do
  echo "== run $i of $REPEAT: starting a throwaway PostgreSQL" >&2
  root="$OUT/postgres-$i"
  rm -rf "$root"
  "$BENCH" postgres "$root" > "$OUT/url-$i" &
  pg=$!
  for _ in $(seq 1 600); do [ -s "$OUT/url-$i" ] && break; sleep 0.1; done
  url=$(head -n1 "$OUT/url-$i")
  [ -n "$url" ] || { echo "PostgreSQL did not start" >&2; exit 1; }

  echo "== run $i: graphile-worker (N=$JOBS, C=$CONCURRENCY)" >&2
  DATABASE_URL="$url" node "$OUT/peer/bench.mjs" --jobs "$JOBS" --concurrency "$CONCURRENCY" \
    --samples "$SAMPLES" > "$OUT/peer-$i.json"
  echo "== run $i: keel (N=$JOBS, C=$CONCURRENCY)" >&2
  RUST_LOG=${RUST_LOG:-warn,sqlx=error} "$BENCH" run --database-url "$url" --jobs "$JOBS" \
    --concurrency "$CONCURRENCY" --samples "$SAMPLES" --out "$OUT/keel-$i.json" "$@" > /dev/null
  for delay in $DB_DELAY_MS; do remote "$delay" "$url" "$i"; done

  stop_postgres
  rm -rf "$root"
done

"$BENCH" report --keel "$OUT"/keel-*.json --peer "$OUT"/peer-*.json
echo "(reports in $OUT)" >&2
