#!/usr/bin/env bash
# A private network for cluster tests: one network namespace per node and
# one for etcd, each with a veth (eth0) into a bridge that lives in a switch
# namespace of its own. Nothing changes in the caller's namespace: no
# address, route or link is added there, so labs of concurrent test runs
# (each its own TAG) never meet, and all share the 10.201.0.0/24 subnet.
#
#   netns.sh up TAG [NODE...]     # default nodes: a b c etcd
#   netns.sh down TAG             # kills what still runs inside, removes all
#   netns.sh link TAG NODE up|down   # cut or restore NODE's link
#   netns.sh rate TAG NODE RATE|off  # caps what NODE sends (tc tbf on its eth0), e.g. 80mbit
#   netns.sh addr NODE            # the node's address
#   netns.sh sweep                # removes labs whose creator (TAG gpufsPID) is gone
#
# Namespaces are TAG-NODE (run a process there: nsenter --net=/run/netns/TAG-NODE
# or ip netns exec TAG-NODE); addresses: a .1, b .2, c .3, d .4, etcd .10,
# anything else .20 up, in the order given.
set -euo pipefail

addr_of() {
  case "$1" in
    a) echo 10.201.0.1 ;; b) echo 10.201.0.2 ;; c) echo 10.201.0.3 ;; d) echo 10.201.0.4 ;;
    etcd) echo 10.201.0.10 ;;
    *) echo "10.201.0.$2" ;;
  esac
}

lab_namespaces() {  # every namespace of lab $1
  ip netns list | awk '{print $1}' | grep -E "^$1-" || true
}

down() {
  local tag=$1 ns pid
  for ns in $(lab_namespaces "$tag"); do
    # Only processes this lab's tests started can live in its namespaces.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  for ns in $(lab_namespaces "$tag"); do ip netns del "$ns" 2>/dev/null || true; done
}

sweep() {
  local tag pid
  for tag in $(ip netns list | awk '{print $1}' | sed -nE 's/^(gpufs[0-9]+)-sw$/\1/p'); do
    pid=${tag#gpufs}
    kill -0 "$pid" 2>/dev/null || down "$tag"
  done
}

up() {
  local tag=$1
  shift
  local nodes=("$@")
  [ ${#nodes[@]} -gt 0 ] || nodes=(a b c etcd)
  sweep
  down "$tag"
  trap 'down "$tag"' ERR
  ip netns add "$tag-sw"
  ip -n "$tag-sw" link set lo up
  ip -n "$tag-sw" link add br0 type bridge
  ip -n "$tag-sw" link set br0 up
  local i=20 n
  for n in "${nodes[@]}"; do
    ip netns add "$tag-$n"
    ip -n "$tag-$n" link set lo up
    ip link add eth0 netns "$tag-$n" type veth peer name "p-$n" netns "$tag-sw"
    ip -n "$tag-sw" link set dev "p-$n" master br0 up
    ip -n "$tag-$n" addr add "$(addr_of "$n" $i)/24" dev eth0
    ip -n "$tag-$n" link set eth0 up
    i=$((i + 1))
  done
  trap - ERR
}

# Sets NODE's bridge port up or down; up returns once both ends carry
# traffic (the kernel applies a regained carrier up to a second later).
link() {
  local tag=$1 node=$2 state=$3
  ip -n "$tag-sw" link set dev "p-$node" "$state"
  [ "$state" = up ] || return 0
  local i
  for i in $(seq 250); do
    if ip -n "$tag-sw" -o link show dev "p-$node" | grep -q 'state UP' &&
       ip -n "$tag-$node" -o link show dev eth0 | grep -q 'state UP'; then
      return 0
    fi
    sleep 0.02
  done
  echo "netns.sh: $node's link did not come up" >&2
  return 1
}

# Caps NODE's sending rate (a token bucket on its eth0), so that a transfer
# from it lasts long enough to be cut in the middle; off removes the cap.
rate() {
  local tag=$1 node=$2 rate=$3
  tc -n "$tag-$node" qdisc del dev eth0 root 2>/dev/null || true
  [ "$rate" = off ] && return 0
  tc -n "$tag-$node" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 1s
}

case "${1:-}" in
  up) [ $# -ge 2 ] || { echo "usage: $0 up TAG [NODE...]" >&2; exit 2; }; shift; up "$@" ;;
  down) [ $# -eq 2 ] || { echo "usage: $0 down TAG" >&2; exit 2; }; down "$2" ;;
  link) [ $# -eq 4 ] || { echo "usage: $0 link TAG NODE up|down" >&2; exit 2; }
        link "$2" "$3" "$4" ;;
  rate) [ $# -eq 4 ] || { echo "usage: $0 rate TAG NODE RATE|off" >&2; exit 2; }
        rate "$2" "$3" "$4" ;;
  addr) [ $# -eq 2 ] || { echo "usage: $0 addr NODE" >&2; exit 2; }; addr_of "$2" 20 ;;
  sweep) sweep ;;
  *) echo "usage: $0 up|down|link|rate|addr|sweep ..." >&2; exit 2 ;;
esac
