#!/usr/bin/env bash
# Two simulated nodes on one machine (issue 4, item 10): two network namespaces joined by a veth
# pair, rate-limited with tc tbf (netem is not available here), one rank per namespace, torchrun
# --nnodes 2 with GLOO_SOCKET_IFNAME set; only the namespaces' own addresses (10.77.0.1/2) are used.
# Runs benchmarks/ddp.py --worker at each rate and writes benchmarks/results/ddp_netsim_<rate>.json
# (NETSIM_OUT: another folder).
#
#   sudo benchmarks/netsim.sh                 # 1gbit and 4gbit (default)
#   sudo benchmarks/netsim.sh 10gbit -- --steps 2 --rounds 2   # extra args go to ddp.py
#   sudo NETSIM_SUFFIX=_b128 benchmarks/netsim.sh 4gbit -- --batch 128   # -> ..._4gbit_b128.json
#   sudo NETSIM_PIN=1 benchmarks/netsim.sh     # >= 4 cores: each node on its own half of them
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

die() { echo "netsim.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root to create network namespaces (ip netns add); run it as root"
command -v ip >/dev/null || die "'ip' (iproute2) is not installed"
command -v tc >/dev/null || die "'tc' (iproute2) is not installed"
[ -x "$TORCHRUN" ] || die "torchrun not found next to $PY (set PYTHON=path/to/venv/bin/python)"

NS_A="protdp_a$$"
NS_B="protdp_b$$"
VA="pva$$"
VB="pvb$$"
set -m  # each node runs as its own process group: a failure or Ctrl-C stops all of it
NODE_PIDS=()
cleanup() {
  for pid in ${NODE_PIDS[@]+"${NODE_PIDS[@]}"}; do kill -- -"$pid" 2>/dev/null || true; done
  NODE_PIDS=()
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  ip link del "$VA" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

setup() {  # $1 = rate
  ip netns add "$NS_A" 2>/dev/null \
    || die "network namespaces are not permitted here (ip netns add failed); run as root on a host/VM that allows them"
  ip netns add "$NS_B"
  ip link add "$VA" type veth peer name "$VB"
  ip link set "$VA" netns "$NS_A"
  ip link set "$VB" netns "$NS_B"
  ip -n "$NS_A" addr add 10.77.0.1/24 dev "$VA"
  ip -n "$NS_B" addr add 10.77.0.2/24 dev "$VB"
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_A" link set "$VA" up
  ip -n "$NS_B" link set "$VB" up
  ip netns exec "$NS_A" tc qdisc add dev "$VA" root tbf rate "$1" burst 1mb latency 50ms
  ip netns exec "$NS_B" tc qdisc add dev "$VB" root tbf rate "$1" burst 1mb latency 50ms
}

# NETSIM_PIN=1: each simulated node gets its own half of the cores (taskset), so one node's
# network CPU does not come out of the other's compute, as on two real hosts (needs >= 4 cores).
PIN_LABEL=""
if [ "${NETSIM_PIN:-0}" = 1 ]; then
  command -v taskset >/dev/null || die "NETSIM_PIN=1 needs 'taskset' (util-linux)"
  NCPU=$(nproc)
  [ "$NCPU" -ge 4 ] || die "NETSIM_PIN=1 needs >= 4 cores (2 per simulated node); this machine has $NCPU"
  HALF=$((NCPU / 2))
  PIN_LABEL=", pinned: node 0 cores 0-$((HALF - 1)), node 1 cores $HALF-$((2 * HALF - 1))"
fi

pin() {  # $1 = node rank: the taskset prefix for that node (nothing without NETSIM_PIN=1)
  [ -n "$PIN_LABEL" ] || return 0
  echo "taskset -c $(($1 * HALF))-$(($1 * HALF + HALF - 1))"
}

run_node() {  # $1 = namespace, $2 = interface, $3 = node rank, $4 = output json, $5 = rate
  # shellcheck disable=SC2046  # pin's output is meant to split into words
  ip netns exec "$1" $(pin "$3") env GLOO_SOCKET_IFNAME="$2" OMP_NUM_THREADS=1 \
    timeout --foreground 1200 "$TORCHRUN" --nnodes 2 --nproc_per_node 1 --node_rank "$3" \
      --master_addr 10.77.0.1 --master_port "$PORT" \
      benchmarks/ddp.py --worker --out "$4" --label "netsim: 2 namespaces, veth + tbf $5$PIN_LABEL" \
      ${EXTRA[@]+"${EXTRA[@]}"}
}

OUT_DIR="${NETSIM_OUT:-benchmarks/results}"  # NETSIM_OUT: another folder for the JSON files
mkdir -p "$OUT_DIR"
for rate in "${RATES[@]}"; do
  out="$OUT_DIR/ddp_netsim_${rate}${NETSIM_SUFFIX:-}.json"
  echo "== netsim at $rate -> $out"
  setup "$rate"
  run_node "$NS_A" "$VA" 0 "$out" "$rate" & pid_a=$!
  run_node "$NS_B" "$VB" 1 "$out" "$rate" > /dev/null & pid_b=$!
  NODE_PIDS=("$pid_a" "$pid_b")
  status=0
  first=""
  wait -n -p first "$pid_a" "$pid_b" || status=$?
  other=$pid_a
  [ "$first" = "$pid_a" ] && other=$pid_b
  # a node that failed leaves its peer waiting at the rendezvous: stop it now, not at its timeout
  [ "$status" = 0 ] || kill -- -"$other" 2>/dev/null || true
  wait "$other" || [ "$status" != 0 ] || status=$?
  NODE_PIDS=()
  cleanup
  [ "$status" = 0 ] || die "benchmark at $rate failed (exit $status)"
done
