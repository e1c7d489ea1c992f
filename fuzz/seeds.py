#!/usr/bin/env python3
"""Write the hand-made seeds of fuzz/corpus/<target>/seed-*: each an input in `arbitrary` 1.x's
encoding of `testkit::fuzzing::ops` (bool and u8: one byte; u32: four, little-endian; an
enum: a u32 whose variant is (x * variants) >> 32; a Vec: a byte with its low bit set before each
element, then one with it clear). Run it from anywhere: `python3 fuzz/seeds.py`."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def u32(x):
    return x.to_bytes(4, "little")


def variant(index, count):
    return u32((index * (1 << 32) + count - 1) // count)


def vec(items):
    out = b""
    for item in items:
        out += b"\x01" + item
    return out + b"\x00"


def byte_vec(data):
    return vec([bytes([b]) for b in data])


# Address
def small(gid, qpn, qkey):
    return variant(0, 3) + bytes([gid, qpn, qkey])


def exact(data):
    return variant(1, 3) + byte_vec(data)


def raw(data):
    return variant(2, 3) + byte_vec(data)


# Op, in the order of its variants
OPS = 11


def resolve(client, address, pin=0):
    return variant(0, OPS) + bytes([client]) + address + bytes([pin])


def try_resolve(client, address, pin=0):
    return variant(1, OPS) + bytes([client]) + address + bytes([pin])


def release(client):
    return variant(2, OPS) + bytes([client])


PIN = variant(3, OPS)


def unpin(pin=0):
    return variant(4, OPS) + bytes([pin])


QUIESCE = variant(5, OPS)


def lease(peer=0):
    """A lease on held peer `peer` (in the order they were resolved, under any live pin)."""
    return variant(6, OPS) + bytes([peer])


def clone_lease(held=0):
    return variant(7, OPS) + bytes([held])


def drop_lease(held=0):
    return variant(8, OPS) + bytes([held])


def lease_direct(client, address):
    """`AddressCache::lease_within`, without a pin (refused while the harness holds one)."""
    return variant(9, OPS) + bytes([client]) + address


def fail_removes(on):
    return variant(10, OPS) + bytes([1 if on else 0])


def cache_ops(efa, capacity, ops):
    return bytes([1 if efa else 0, capacity]) + vec(ops)


def tcp_ops(ops):
    return vec(ops)


def address_input(efa, address_len, addr_format, data):
    return bytes([1 if efa else 0, address_len]) + u32(addr_format) + byte_vec(data)


def write(target, name, data, prefix="seed-"):
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, prefix + name), "wb") as f:
        f.write(data)


LARGE = 0x80

# cache_ops, efa: with one held pin, `pin=0` names it; with none, every resolve pins for itself.
A, A2, A3, B, C = small(0, 0, 0), small(0, 0, 1), small(0, 0, 3), small(0, 1, 0), small(1, 2, 0)
write("cache_ops", "efa-share-release", cache_ops(True, LARGE, [
    resolve(1, A), resolve(2, A), resolve(3, B), release(1), release(2), QUIESCE, release(3)]))
write("cache_ops", "efa-recycled-qpn", cache_ops(True, LARGE, [
    resolve(1, A), resolve(2, A), PIN, resolve(3, A2, 0), resolve(4, A2, 0), unpin(0), QUIESCE,
    resolve(3, A2), resolve(1, A)]))
write("cache_ops", "efa-pointer-bytes", cache_ops(True, LARGE, [
    PIN, resolve(1, A, 0), resolve(2, A3, 0), resolve(1, A, 0), unpin(0), QUIESCE]))
write("cache_ops", "efa-revive", cache_ops(True, LARGE, [
    PIN, resolve(1, A, 0), release(1), resolve(1, A, 0), resolve(2, C, 0), unpin(0), QUIESCE]))
write("cache_ops", "efa-parked-try", cache_ops(True, LARGE, [
    PIN, resolve(1, A, 0), try_resolve(2, A2, 0), try_resolve(3, A2, 0), PIN, unpin(0),
    try_resolve(2, A2, 0), unpin(0), QUIESCE, try_resolve(3, A2), resolve(3, A2)]))
write("cache_ops", "efa-capacity", cache_ops(True, 0, [
    resolve(1, A), resolve(2, B), release(1), resolve(2, B), PIN, release(2), resolve(1, C, 0),
    unpin(0), QUIESCE, resolve(1, C)]))
write("cache_ops", "efa-bad-input", cache_ops(True, 2, [
    resolve(1, A), resolve(1, raw(b"")), resolve(2, raw(bytes(31))), try_resolve(3, raw(bytes(33))),
    resolve(4, exact(b"\x01\x02")), resolve(1, A), release(9), release(1), release(4)]))
write("cache_ops", "efa-pins", cache_ops(True, 3, [
    PIN, PIN, resolve(1, A, 0), resolve(2, B, 1), release(1), unpin(0), resolve(1, B, 0), PIN,
    release(2), unpin(1), resolve(3, A2, 2), QUIESCE, unpin(0), unpin(0), QUIESCE]))
# cache_ops, leases. A lease keeps its entry (and on efa, a new incarnation parked behind it)
# until dropped; lease_within waits for a parked incarnation, and times out behind a lease.
write("cache_ops", "efa-lease-parked", cache_ops(True, LARGE, [
    PIN, resolve(1, A, 0), lease(0), unpin(0), resolve(2, A2), lease_direct(3, A2), QUIESCE,
    resolve(2, A2), drop_lease(0), lease_direct(3, A2), release(2), QUIESCE, drop_lease(0),
    QUIESCE]))
write("cache_ops", "efa-lease-retired", cache_ops(True, 0, [
    PIN, resolve(1, A, 0), release(1), lease(0), clone_lease(0), unpin(0), QUIESCE,
    resolve(2, B), drop_lease(0), QUIESCE, resolve(2, B), drop_lease(0), QUIESCE, resolve(2, B),
    lease_direct(2, B), PIN, lease_direct(3, C), unpin(0), release(2), QUIESCE]))
write("cache_ops", "efa-lease-revive", cache_ops(True, 2, [
    lease_direct(1, A), release(1), QUIESCE, lease_direct(1, A), release(1), drop_lease(0),
    QUIESCE, lease_direct(2, A2), drop_lease(1), QUIESCE]))
# Failing removes: the entry stays counted (capacity) and on efa its identity stays blocked.
write("cache_ops", "efa-failed-removes", cache_ops(True, 1, [
    resolve(1, A), fail_removes(True), release(1), QUIESCE, resolve(2, B), resolve(2, A2),
    PIN, resolve(1, A, 0), lease(0), unpin(0), fail_removes(False), release(1), QUIESCE,
    try_resolve(3, B), try_resolve(3, B), drop_lease(0), QUIESCE]))
write("cache_ops", "opaque-lease-capacity", cache_ops(False, 0, [
    lease_direct(1, small(0, 0, 0)), release(1), QUIESCE, try_resolve(2, small(1, 1, 1)),
    try_resolve(2, small(1, 1, 1)), try_resolve(2, small(1, 1, 1)), fail_removes(True),
    drop_lease(0), QUIESCE, resolve(2, small(1, 1, 1)), fail_removes(False), QUIESCE,
    resolve(2, small(1, 1, 1))]))

# cache_ops, opaque
D, E, F = small(0, 0, 0), small(1, 1, 1), small(0, 2, 1)
write("cache_ops", "opaque-churn", cache_ops(False, 4, [
    resolve(1, D), resolve(2, D), resolve(1, E), resolve(3, F), release(2), resolve(2, E),
    try_resolve(4, D), QUIESCE, resolve(4, D), release(1), release(2), release(3)]))
write("cache_ops", "opaque-capacity", cache_ops(False, 0, [
    resolve(1, D), resolve(2, E), PIN, release(1), resolve(2, E, 0), resolve(1, D, 0), unpin(0),
    QUIESCE, resolve(2, E)]))
write("cache_ops", "opaque-bad-input", cache_ops(False, LARGE, [
    resolve(1, raw(bytes(15))), resolve(1, raw(bytes(17))), resolve(1, exact(b"\xff" * 16)),
    try_resolve(2, raw(b"")), resolve(2, D)]))

# Found by cache_ops, kept as seeds: the harness's insert check during a removal, and the model's
# branching on a resolving client's old identity (commit cc622fe).
write("cache_ops", "harness-insert-check-during-removal", cache_ops(False, LARGE, [
    resolve(1, raw(bytes([0] * 13 + [9, 0])), 0), resolve(0, small(254, 0, 1), 0),
    resolve(0, small(1, 0, 1), 0), resolve(0, small(1, 0, 1), 0), resolve(0, small(86, 85, 85), 255),
    resolve(255, raw(b"\xff" * 11), 0), try_resolve(2, raw(b""), 0), QUIESCE]), prefix="regression-")
write("cache_ops", "model-detach-old-identity", cache_ops(True, 1, [
    resolve(0, small(171, 170, 170), 170), resolve(0, small(1, 0, 1), 0), QUIESCE, QUIESCE, QUIESCE,
    resolve(0, small(17, 17, 64), 23), resolve(23, small(23, 23, 23), 23),
    resolve(23, small(23, 23, 23), 23), resolve(23, small(23, 0, 0), 17),
    resolve(17, small(17, 17, 64), 23), resolve(23, small(23, 23, 23), 23),
    resolve(0, small(0, 0, 0), 0)]), prefix="regression-")

# tcp_av: family byte 3 is AF_INET, 0 none, 1 AF_INET6, 2 AF_UNIX; port byte % 6 (0 is bad);
# host byte 1 is 127.0.0.1, 0 is 0.0.0.0, 2 adds garbage padding, others 127.0.0.2-4.
G, H, I = small(3, 1, 1), small(3, 2, 1), small(3, 3, 3)
write("tcp_av", "share-release", tcp_ops([
    resolve(1, G), resolve(2, G), resolve(3, H), release(1), resolve(1, I), release(2),
    release(3), QUIESCE]))
write("tcp_av", "malformed", tcp_ops([
    resolve(1, small(0, 1, 1)), resolve(1, small(1, 1, 1)), resolve(1, small(2, 1, 1)),
    resolve(1, small(3, 0, 1)), resolve(1, small(3, 1, 0)), resolve(1, small(3, 1, 2)),
    resolve(2, exact(bytes(16))), resolve(2, exact(b"\xff" * 16)), resolve(3, raw(bytes(15))),
    try_resolve(3, small(1, 1, 1)), resolve(1, G)]))
write("tcp_av", "capacity", tcp_ops([
    resolve(c, small(3, 1 + c % 5, 1 + c // 5 * 2)) for c in range(6)
] + [resolve(5, small(3, 4, 4)), release(0), QUIESCE, resolve(5, small(3, 4, 4))]))
write("tcp_av", "pins-revive", tcp_ops([
    PIN, resolve(1, G, 0), release(1), resolve(1, G, 0), resolve(2, H, 0), PIN, release(2),
    unpin(0), resolve(2, H, 0), unpin(0), QUIESCE]))
write("tcp_av", "leases", tcp_ops([
    PIN, resolve(1, G, 0), lease(0), unpin(0), release(1), QUIESCE, lease_direct(2, H),
    lease_direct(3, small(0, 1, 1)), fail_removes(True), resolve(1, I), drop_lease(0), QUIESCE,
    drop_lease(0), release(2), QUIESCE]))

# Found by the tcp_av target: one AF_UNSPEC sockaddr, and every later new address is refused
# with -FI_EINVAL (tests/fuzz_regressions.rs). Skipped by the target until the cache refuses it.
write("tcp_av", "bad-family-poisons-av", tcp_ops([
    resolve(1, small(0, 1, 1)), resolve(2, small(3, 2, 1))]), prefix="regression-")

# address
EFA = 12
write("address", "efa", address_input(True, 0, EFA, bytes(range(32))))
write("address", "efa-short", address_input(True, 0, EFA, bytes(range(31))))
write("address", "efa-16", address_input(True, 16, 2, bytes(range(16))))
write("address", "opaque", address_input(False, 0, 2, bytes(range(16))))
write("address", "opaque-long", address_input(False, 0, 2, bytes(range(17))))
write("address", "empty", address_input(False, 0, 0, b""))
