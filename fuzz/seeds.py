#!/usr/bin/env python3
"""Write the hand-made seeds of fuzz/corpus/<target>/seed-*: each an input in `arbitrary` 1.x's
encoding of `dma_libfabric::fuzzing::ops` (bool and u8: one byte; u32: four, little-endian; an
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


# Op
def resolve(client, address, pin=0):
    return variant(0, 6) + bytes([client]) + address + bytes([pin])


def try_resolve(client, address, pin=0):
    return variant(1, 6) + bytes([client]) + address + bytes([pin])


def release(client):
    return variant(2, 6) + bytes([client])


PIN = variant(3, 6)


def unpin(pin=0):
    return variant(4, 6) + bytes([pin])


QUIESCE = variant(5, 6)


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
