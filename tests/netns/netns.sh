# shellcheck shell=bash
# A private test network of network namespaces, for tests that need several
# hosts on one machine (source it from bash):
#
#   netns_up PREFIX N        namespaces PREFIX-sw (a bridge, the switch) and
#                            PREFIX-1 .. PREFIX-N, each joined to the switch
#                            by a veth pair, host i at 10.201.0.i/24 (loopback
#                            up in each); sets NETNS_PREFIX
#   netns_addr I             prints host I's address
#   netns_name I             prints host I's namespace name (for `ip netns
#                            exec NAME CMD &`, whose $! is CMD's own pid)
#   netns_exec I CMD...      runs CMD in host I's namespace
#   netns_link I down|up     takes host I's link to the switch down or up
#                            (the switch side, as a pulled cable)
#   netns_down               removes every namespace netns_up made (and with
#                            them their links); safe to call twice
#
# Nothing is created in the caller's namespace; needs root and iproute2.
# The test network's addresses exist only inside these namespaces.
NETNS_PREFIX=""
NETNS_COUNT=0

netns_up() {  # prefix, count
  NETNS_PREFIX="$1"
  NETNS_COUNT="$2"
  ip netns add "$NETNS_PREFIX-sw"
  ip -n "$NETNS_PREFIX-sw" link add br0 type bridge
  ip -n "$NETNS_PREFIX-sw" link set br0 up
  local i
  for ((i = 1; i <= NETNS_COUNT; ++i)); do
    ip netns add "$NETNS_PREFIX-$i"
    ip -n "$NETNS_PREFIX-$i" link set lo up
    # Created inside the host's namespace, the peer moved to the switch.
    ip -n "$NETNS_PREFIX-$i" link add eth0 type veth peer name "port$i" netns "$NETNS_PREFIX-sw"
    ip -n "$NETNS_PREFIX-sw" link set "port$i" master br0
    ip -n "$NETNS_PREFIX-sw" link set "port$i" up
    ip -n "$NETNS_PREFIX-$i" addr add "$(netns_addr "$i")/24" dev eth0
    ip -n "$NETNS_PREFIX-$i" link set eth0 up
  done
}

netns_addr() { echo "10.201.0.$1"; }

netns_name() { echo "$NETNS_PREFIX-$1"; }

netns_exec() {  # host, command...
  local host="$1"
  shift
  ip netns exec "$NETNS_PREFIX-$host" "$@"
}

netns_link() {  # host, down|up
  ip -n "$NETNS_PREFIX-sw" link set "port$1" "$2"
}

netns_down() {
  [ -n "$NETNS_PREFIX" ] || return 0
  local i
  for ((i = 1; i <= NETNS_COUNT; ++i)); do
    # Processes still inside would keep nothing alive, but end them first.
    ip netns pids "$NETNS_PREFIX-$i" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$NETNS_PREFIX-$i" 2>/dev/null || true
  done
  ip netns del "$NETNS_PREFIX-sw" 2>/dev/null || true
  NETNS_PREFIX=""
}
