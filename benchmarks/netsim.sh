#!/usr/bin/env bash
# Simulated nodes on one machine (issue 4, item 10; issue 22): network namespaces joined pairwise
# by veths (a full mesh: every pair of nodes has its own link), each veth rate-limited with tc tbf
# (netem is not available here), one rank per namespace, torchrun --nnodes N with
# GLOO_SOCKET_IFNAME set; only the namespaces' own addresses (10.77.<link>.1/2) are used.
# Each node binds on its first link's address and reaches every other node's bind address through
# their direct link (a /32 route), so pair (i, j) traffic crosses link i-j only.
# Runs benchmarks/ddp.py --worker at each rate and writes benchmarks/results/ddp_netsim_<rate>.json
# (NETSIM_OUT: another folder).
#
#   sudo benchmarks/netsim.sh                 # 1gbit and 4gbit (default), 2 nodes
#   sudo benchmarks/netsim.sh 10gbit -- --steps 2 --rounds 2   # extra args go to the script
#   sudo NETSIM_SUFFIX=_b128 benchmarks/netsim.sh 4gbit -- --batch 128   # -> ..._4gbit_b128.json
#   sudo NETSIM_PIN=1 benchmarks/netsim.sh     # >= 2 cores per node: each node on its own cores
#   sudo NETSIM_NODES=3 NETSIM_SLOW=1-2:1gbit benchmarks/netsim.sh 4gbit   # 3 nodes, link 1-2 slow
#   sudo NETSIM_SCRIPT=benchmarks/preflight_check.py NETSIM_PREFIX=preflight_netsim \
#        benchmarks/netsim.sh 4gbit           # another worker script (same --worker/--out/--label)
#
# Needs root (CI runs as root); exits with a clear message where namespaces are not permitted.
# The namespaces are always deleted (trap), also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

RATES=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do RATES+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
[ ${#RATES[@]} -eq 0 ] && RATES=(1gbit 4gbit)

PY="${PYTHON:-.venv/bin/python}"
TORCHRUN="$(dirname "$PY")/torchrun"
PORT="${NETSIM_PORT:-29555}"
NODES="${NETSIM_NODES:-2}"
SCRIPT="${NETSIM_SCRIPT:-benchmarks/ddp.py}"
PREFIX="${NETSIM_PREFIX:-ddp_netsim}"
SLOW="${NETSIM_SLOW:-}"   # "I-J:RATE": link between nodes I and J at RATE instead

die() { echo "netsim.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root to create network namespaces (ip netns add); run it as root"
command -v ip >/dev/null || die "'ip' (iproute2) is not installed"
command -v tc >/dev/null || die "'tc' (iproute2) is not installed"
[ -x "$TORCHRUN" ] || die "torchrun not found next to $PY (set PYTHON=path/to/venv/bin/python)"
[ -f "$SCRIPT" ] || die "NETSIM_SCRIPT=$SCRIPT: no such file"
[[ "$NODES" =~ ^[2-9]$ ]] || die "NETSIM_NODES=$NODES: expected 2..9 nodes"
SLOW_I=""; SLOW_J=""; SLOW_RATE=""
if [ -n "$SLOW" ]; then
  [[ "$SLOW" =~ ^([0-9])-([0-9]):([0-9.]+[kmg]?bit)$ ]] \
    || die "NETSIM_SLOW=$SLOW: expected I-J:RATE, e.g. 1-2:1gbit"
  SLOW_I=${BASH_REMATCH[1]}; SLOW_J=${BASH_REMATCH[2]}; SLOW_RATE=${BASH_REMATCH[3]}
  if [ "$SLOW_I" -gt "$SLOW_J" ]; then t=$SLOW_I; SLOW_I=$SLOW_J; SLOW_J=$t; fi
  [ "$SLOW_I" != "$SLOW_J" ] && [ "$SLOW_J" -lt "$NODES" ] \
    || die "NETSIM_SLOW=$SLOW: nodes must be two different ones of 0..$((NODES - 1))"
fi

ns() { echo "protdp_$1_$$"; }             # namespace of node $1
dev() { echo "e$1$2_$$"; }                # node $1's interface on its link to node $2
link_index() { echo $(($1 * NODES + $2 - 1)); }  # $1 < $2: link subnet 10.77.<index>.0/24 (0-1: 0)
addr() {  # node $1's address on its link to node $2
  if [ "$1" -lt "$2" ]; then echo "10.77.$(link_index "$1" "$2").1"; else echo "10.77.$(link_index "$2" "$1").2"; fi
}
first_peer() { if [ "$1" = 0 ]; then echo 1; else echo 0; fi; }
bind_addr() { addr "$1" "$(first_peer "$1")"; }   # where node $1's gloo listens
bind_dev() { dev "$1" "$(first_peer "$1")"; }

set -m  # each node runs as its own process group: a failure or Ctrl-C stops all of it
NODE_PIDS=()
cleanup() {
  for pid in ${NODE_PIDS[@]+"${NODE_PIDS[@]}"}; do kill -- -"$pid" 2>/dev/null || true; done
  NODE_PIDS=()
  for ((i = 0; i < NODES; i++)); do ip netns del "$(ns $i)" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

rate_of() {  # $1 < $2: the rate of link $1-$2
  if [ "$1" = "$SLOW_I" ] && [ "$2" = "$SLOW_J" ]; then echo "$SLOW_RATE"; else echo "$RATE"; fi
}

setup() {  # full mesh of rate-limited veths between $NODES namespaces
  ip netns add "$(ns 0)" 2>/dev/null \
    || die "network namespaces are not permitted here (ip netns add failed); run as root on a host/VM that allows them"
  for ((i = 1; i < NODES; i++)); do ip netns add "$(ns $i)"; done
  for ((i = 0; i < NODES; i++)); do
    ip -n "$(ns $i)" link set lo up
    ip netns exec "$(ns $i)" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  done
  for ((i = 0; i < NODES; i++)); do
    for ((j = i + 1; j < NODES; j++)); do
      ip link add "$(dev $i $j)" netns "$(ns $i)" type veth peer name "$(dev $j $i)" netns "$(ns $j)"
      for pair in "$i $j" "$j $i"; do
        set -- $pair
        ip -n "$(ns $1)" addr add "$(addr $1 $2)/24" dev "$(dev $1 $2)"
        ip -n "$(ns $1)" link set "$(dev $1 $2)" up
        ip netns exec "$(ns $1)" tc qdisc add dev "$(dev $1 $2)" root tbf rate "$(rate_of $i $j)" \
          burst 1mb latency 50ms
      done
    done
  done
  for ((i = 0; i < NODES; i++)); do   # every peer's bind address over the direct link
    for ((j = 0; j < NODES; j++)); do
      [ "$i" = "$j" ] || ip -n "$(ns $i)" route replace "$(bind_addr $j)/32" dev "$(dev $i $j)"
    done
  done
}

# NETSIM_PIN=1: each simulated node gets its own share of the cores (taskset), so one node's
# network CPU does not come out of another's compute, as on real hosts (needs >= 2 per node).
PIN_LABEL=""
if [ "${NETSIM_PIN:-0}" = 1 ]; then
  command -v taskset >/dev/null || die "NETSIM_PIN=1 needs 'taskset' (util-linux)"
  NCPU=$(nproc)
  SHARE=$((NCPU / NODES))
  [ "$SHARE" -ge 2 ] || die "NETSIM_PIN=1 needs >= $((2 * NODES)) cores (2 per simulated node); this machine has $NCPU"
  PIN_LABEL=", pinned: $SHARE cores per node"
fi

pin() {  # $1 = node rank: the taskset prefix for that node (nothing without NETSIM_PIN=1)
  [ -n "$PIN_LABEL" ] || return 0
  echo "taskset -c $(($1 * SHARE))-$(($1 * SHARE + SHARE - 1))"
}

run_node() {  # $1 = node rank, $2 = output json, $3 = label
  # shellcheck disable=SC2046  # pin's output is meant to split into words
  ip netns exec "$(ns $1)" $(pin "$1") env GLOO_SOCKET_IFNAME="$(bind_dev $1)" OMP_NUM_THREADS=1 \
    timeout --foreground 1200 "$TORCHRUN" --nnodes "$NODES" --nproc_per_node 1 --node_rank "$1" \
      --master_addr "$(bind_addr 0)" --master_port "$PORT" \
      "$SCRIPT" --worker --out "$2" --label "$3" ${EXTRA[@]+"${EXTRA[@]}"}
}

OUT_DIR="${NETSIM_OUT:-benchmarks/results}"  # NETSIM_OUT: another folder for the JSON files
mkdir -p "$OUT_DIR"
for RATE in "${RATES[@]}"; do
  out="$OUT_DIR/${PREFIX}_${RATE}${NETSIM_SUFFIX:-}.json"
  label="netsim: $NODES namespaces, veth + tbf $RATE"
  [ -z "$SLOW" ] || label="$label, link $SLOW_I-$SLOW_J at $SLOW_RATE"
  echo "== netsim at $RATE${SLOW:+ (link $SLOW_I-$SLOW_J at $SLOW_RATE)}, $NODES nodes -> $out"
  setup
  NODE_PIDS=()
  for ((i = 0; i < NODES; i++)); do
    if [ "$i" = 0 ]; then run_node 0 "$out" "$label$PIN_LABEL" & else
      run_node "$i" "$out" "$label$PIN_LABEL" > /dev/null & fi
    NODE_PIDS+=("$!")
  done
  status=0
  first=""
  wait -n -p first "${NODE_PIDS[@]}" || status=$?
  # a node that failed leaves its peers waiting at the rendezvous: stop them now, not at timeout
  if [ "$status" != 0 ]; then
    for pid in "${NODE_PIDS[@]}"; do [ "$pid" = "$first" ] || kill -- -"$pid" 2>/dev/null || true; done
  fi
  for pid in "${NODE_PIDS[@]}"; do
    [ "$pid" = "$first" ] && continue
    wait "$pid" || [ "$status" != 0 ] || status=$?
  done
  NODE_PIDS=()
  cleanup
  [ "$status" = 0 ] || die "benchmark at $RATE failed (exit $status)"
done
