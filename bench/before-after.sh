#!/usr/bin/env bash
# bench/before-after.sh NEWDIR OLDBIN [REPS]: the issue-16 comparison of docs/benchmarks.md.
# NEWDIR holds this build's `keel` and `keel-bench`; OLDBIN is a `keel` from before the
# benchmark became its own binary (`keel bench …`). Per repetition, two fresh clusters (A for
# the peer and the new build, B for the old build, whose migrations stop at 0012): the queue
# figures with the database local, 1 ms and 5 ms away (../shared/bench/tools/delay-proxy.py,
# both sides through it), then the runs figure; everything interleaved. The peer must be
# installed at $PEER_DIR (a copy of ../shared/bench/peers/graphile-worker after `npm ci`).
# Reports go to $OUT (JSON, one per figure and repetition).
set -uo pipefail
NEW=$1; OLD=$2; REPS=${3:-3}
OUT=${OUT:-/tmp/keel-before-after}; PEER_DIR=${PEER_DIR:-/tmp/keel-peer}
mkdir -p $OUT; chmod 755 $OUT
PROXY=${PROXY:-$(dirname "$0")/../../shared/bench/tools/delay-proxy.py}
J=10000; C=16; S=300
export RUST_LOG=warn,sqlx=error
start_cluster() { # bin-cmd root urlfile
  rm -rf $2; $1 postgres $2 > $3 &
  echo $!
}
wait_url() { for _ in $(seq 1 600); do [ -s $1 ] && break; sleep 0.1; done; head -n1 $1; }
far() { # url delay -> prints far url, sets PX
  local url=$1 d=$2 target port
  target=${url#*@}; target=${target%%/*}
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 $PROXY $port ${target%:*} ${target##*:} $d > /dev/null 2>&1 &
  echo "$! ${url%@*}@127.0.0.1:$port/${url##*/}"
}
for i in $(seq 1 $REPS); do
  pa=$(start_cluster "$NEW/keel-bench" $OUT/pga-$i $OUT/urla-$i)
  pb=$(start_cluster "$OLD bench" $OUT/pgb-$i $OUT/urlb-$i)
  ua=$(wait_url $OUT/urla-$i); ub=$(wait_url $OUT/urlb-$i)
  for d in 0 1 5; do
    echo "rep $i delay $d $(date +%T)"
    if [ $d = 0 ]; then fa=$ua; fb=$ub; pxa=""; pxb=""; extra="";
    else read pxa fa < <(far $ua $d); read pxb fb < <(far $ub $d); extra="--db-delay-ms $d"; sleep 0.5; fi
    DATABASE_URL="$fa" node $PEER_DIR/bench.mjs --jobs $J --concurrency $C --samples $S > $OUT/peer-d$d-$i.json
    $NEW/keel-bench run --database-url "$fa" --figures queue --jobs $J --concurrency $C --samples $S $extra --out $OUT/new-d$d-$i.json > /dev/null
    $OLD bench run --database-url "$fb" --figures queue --jobs $J --concurrency $C --samples $S --out $OUT/old-d$d-$i.json > /dev/null
    [ -n "$pxa" ] && { kill $pxa $pxb; wait $pxa $pxb 2>/dev/null; }
  done
  echo "rep $i runs $(date +%T)"
  $NEW/keel-bench run --database-url "$ua" --figures runs --run-workers 1,2,4 --concurrency $C --out $OUT/new-runs-$i.json > /dev/null 2>$OUT/new-runs-$i.err
  for w in 1 2 4; do
    $OLD bench run --database-url "$ub" --figures runs --run-workers $w --concurrency $C --out $OUT/old-runs-$w-$i.json > /dev/null 2>>$OUT/old-runs-$i.err
  done
  # The clusters were started in command substitutions, so they are not this shell's
  # children: wait for them to exit before removing their directories.
  kill $pa $pb; while kill -0 $pa 2>/dev/null || kill -0 $pb 2>/dev/null; do sleep 0.2; done
  rm -rf $OUT/pga-$i $OUT/pgb-$i
done
echo "done $(date +%T)"
