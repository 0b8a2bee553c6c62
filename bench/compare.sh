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
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-20000}
CONCURRENCY=${CONCURRENCY:-16}
SAMPLES=${SAMPLES:-300}
REPEAT=${REPEAT:-1}
PEER=${PEER:-../shared/bench/peers/graphile-worker}
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
stop_postgres() {
  if [ -n "$pg" ]; then kill "$pg" 2>/dev/null || true; wait "$pg" 2>/dev/null || true; pg=""; fi
}
trap stop_postgres EXIT

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

  stop_postgres
  rm -rf "$root"
done

"$BENCH" report --keel "$OUT"/keel-*.json --peer "$OUT"/peer-*.json
echo "(reports in $OUT)" >&2
