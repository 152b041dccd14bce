#!/usr/bin/env bash
# The multi-host test on one machine: two network namespaces ("hosts") joined by a veth pair,
# with addresses inside those namespaces only, and the whole multi-process suite, then the
# endpoint suite, run across them over libfabric's tcp provider (ranks 0..n/2-1 on host 0,
# the others on host 1, placed by rank-wrapper.sh under `weft run`). Needs root
# (CAP_NET_ADMIN) and iproute2; says why and fails when it cannot set the namespaces up, never
# skips silently.
#
# usage: tests/netns/two-hosts.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."
here=$(pwd)/tests/netns
cleanup() {
    ip netns del weft-h0 2>/dev/null || true
    ip netns del weft-h1 2>/dev/null || true
}
fail() { echo "two-host namespace test cannot run: $*" >&2; cleanup; exit 1; }
command -v ip >/dev/null || fail "iproute2's ip is not installed (apt-get install iproute2)"
cleanup
trap cleanup EXIT
ip netns add weft-h0 || fail "ip netns add failed (needs root / CAP_NET_ADMIN)"
ip netns add weft-h1 || fail "ip netns add failed"
ip link add weftv0 netns weft-h0 type veth peer name weftv1 netns weft-h1 || fail "no veth support"
ip -n weft-h0 addr add 10.77.0.1/24 dev weftv0
ip -n weft-h1 addr add 10.77.0.2/24 dev weftv1
for h in 0 1; do
    ip -n weft-h$h link set lo up
    ip -n weft-h$h link set weftv$h up
done
# Reachability without ping: a connection to a closed port on the other host is refused.
{ ip netns exec weft-h0 timeout 3 bash -c 'echo > /dev/tcp/10.77.0.2/9' 2>&1 || true; } | grep -q refused \
    || fail "the veth link does not pass traffic"
# libfabric must see each host's interface before the ranks start.
for h in 0 1; do
    for try in $(seq 50); do
        ip netns exec weft-h$h fi_info -p tcp -d weftv$h >/dev/null 2>&1 && break
        [ "$try" = 50 ] && fail "libfabric's tcp provider does not list weftv$h on host $h (fi_info)"
        sleep 0.1
    done
done
echo "hosts: weft-h0 (10.77.0.1, weftv0) <-> weft-h1 (10.77.0.2, weftv1)"
WEFT_TEST_WRAPPER=$here/rank-wrapper.sh WEFT_FABRIC=ofi WEFT_OFI_PROVIDER=tcp \
    cargo test --features cluster --test multirank "$@"
# Endpoints across the hosts: with 4 ranks each slot is rings to the neighbour plus a
# libfabric endpoint to the other host (the hybrid fabric's slots); with 2, libfabric only.
WEFT_TEST_WRAPPER=$here/rank-wrapper.sh WEFT_FABRIC=ofi WEFT_OFI_PROVIDER=tcp \
    cargo test --features cluster --test endpoints "$@"
# The fabric each placement gets: one rank per host talks libfabric only; two per host talk
# shared memory to the neighbour and libfabric across (the hybrid fabric), or libfabric to
# everyone when WEFT_SAME_HOST=ofi.
weft=target/debug/weft
expect() {
    local n=$1 want=$2 out got
    shift 2
    out=$(env "$@" WEFT_FABRIC=ofi WEFT_OFI_PROVIDER=tcp \
        $weft run -n "$n" -- "$here/rank-wrapper.sh" $weft __rank info --segment-kib 64 --threads 1)
    got=$(awk '{ sub(/^\[0\] /, "") } $1 == "fabric" { print $2 }' <<<"$out")
    if [ "$got" != "$want" ]; then
        echo "$n ranks on two hosts $*: expected fabric $want, got:"; echo "$out"; exit 1
    fi
    echo "$n ranks on two hosts $*: fabric $want"
}
expect 2 ofi
expect 4 ofi+shm
expect 4 ofi WEFT_SAME_HOST=ofi
