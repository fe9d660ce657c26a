"""Transfer wire format: spec vectors both ways, hostile messages and manifests, config validation."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosp2p.errors import ConfigError, RemoteProtocolError
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import (
    DTYPE_ITEMSIZE,
    WIRE_MAX_FRAME_BYTES,
    BufferSpec,
    CancelRequest,
    DataHeader,
    ErrorReply,
    GetChunks,
    GetManifest,
    GetRange,
    GetVersions,
    Manifest,
    ManifestReply,
    ReleaseLease,
    TransferErrorCode,
    VersionInfo,
    VersionsReply,
    check_manifest,
    codec,
    decode_manifest,
    decode_message,
    encode_manifest,
    hash_function,
    manifest_digest,
)

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "transfer.md"
DIGEST = bytes(range(16))
MESSAGES: dict[str, Any] = {
    "GetVersions": GetVersions(request_id=1, run="run-a"),
    "VersionsReply": VersionsReply(
        request_id=1,
        run="run-a",
        versions=(VersionInfo(step=42, total_bytes=8192, chunk_bytes=4096, hash_algorithm="xxh3_128", digest=DIGEST),),
    ),
    "GetManifest": GetManifest(request_id=2, run="run-a", step=42, include_manifest=True, lease_id=None),
    "GetManifestRenew": GetManifest(request_id=3, run="run-a", step=42, include_manifest=False, lease_id=7),
    "ManifestReply": ManifestReply(
        request_id=2, lease_id=7, lease_ttl_s=60.0, hash_algorithm="xxh3_128", digest=DIGEST, manifest_bytes=123
    ),
    "GetChunks": GetChunks(request_id=4, run="run-a", step=42, lease_id=7, first_chunk=1, chunk_count=1),
    "GetRange": GetRange(request_id=5, run="run-a", step=42, lease_id=7, offset=4096, length=100),
    "DataHeader": DataHeader(request_id=4, offset=4096, length=4096),
    "ReleaseLease": ReleaseLease(lease_id=7),
    "ErrorReply": ErrorReply(request_id=5, code=TransferErrorCode.OUT_OF_RANGE, detail="snapshot has 8192 bytes"),
    "CancelRequest": CancelRequest(request_id=9),
    "ErrorCancelled": ErrorReply(request_id=9, code=TransferErrorCode.CANCELLED, detail="cancelled"),
}
VECTOR_MANIFEST = Manifest(
    run="run-a",
    step=42,
    total_bytes=8192,
    chunk_bytes=4096,
    hash_algorithm="xxh3_128",
    buffers=(
        BufferSpec(name="w", dtype="float32", shape=(2, 3), offset=0, length=24),
        BufferSpec(name="z", dtype="int64", shape=(), offset=64, length=8),
    ),
    chunk_hashes=bytes(32),
)
CONFIG = TransferConfig()


def vectors() -> list[tuple[str, str]]:
    match = re.search(r"```vectors\n(.*?)```", SPEC.read_text(), re.S)
    assert match, "protocols/transfer.md has no ```vectors block"
    lines = [line.split() for line in match.group(1).splitlines() if line.strip()]
    return [(name, hex_text) for name, hex_text in lines]


def test_every_message_type_has_a_vector() -> None:
    names = {name for name, _ in vectors()}
    assert names == set(MESSAGES) | {"ManifestBody"}
    assert {type(m) for m in MESSAGES.values()} == set(codec.message_classes().values())


@pytest.mark.parametrize(("name", "hex_text"), vectors())
def test_vector_encodes_and_decodes(name: str, hex_text: str) -> None:
    raw = bytes.fromhex(hex_text)
    if name == "ManifestBody":
        assert encode_manifest(VECTOR_MANIFEST) == raw
        decoded = decode_manifest(raw, max_bytes=1 << 20)
        assert decoded == VECTOR_MANIFEST
        check_manifest(decoded, CONFIG)
        return
    assert codec.encode(MESSAGES[name]) == raw
    assert codec.decode(raw, max_bytes=1 << 20) == MESSAGES[name]


def test_optional_fields_may_be_omitted_and_extra_ones_ignored() -> None:
    obj = codec.to_obj(MESSAGES["GetManifest"])
    assert codec.from_obj(obj[:4]) == GetManifest(request_id=2, run="run-a", step=42)
    assert codec.from_obj([*obj, "future field"]) == MESSAGES["GetManifest"]


@pytest.mark.parametrize(
    "obj",
    [
        [1, -1, "run"],  # negative request id
        [1, 1, ""],  # empty run
        [1, 1, "r" * 2000],  # run too long
        [5, 1, "r", 1, 1, 0, 0],  # zero chunk_count
        [6, 1, "r", 1, 1, 0, 0],  # zero length
        [7, 1, 0, 0],  # zero-length data header
        [4, 1, 1, 0.0, "xxh3_128", DIGEST, 0],  # zero lease ttl
        [4, 1, 1, 10.0, "xxh3_128", b"", 0],  # empty digest
        [9, 1, 99, ""],  # unknown error code
        [9, 1, 3, "x" * 5000],  # detail too long
        [2, 1, "r", [[1, 1, 0, "xxh3_128", DIGEST]]],  # chunk_bytes 0
        [2, 1, "r", [[1, 1, 1, "xxh3_128", DIGEST]] * 65],  # too many versions
        [3, 1, "r", 1, 1],  # include_manifest must be a bool
        [7, True, 0, 1],  # bool is not an int
        [42, 1],  # unknown type
    ],
)
def test_bad_messages_are_remote_protocol_errors(obj: list[Any]) -> None:
    with pytest.raises(RemoteProtocolError):
        codec.decode(msgpack.packb(obj, use_bin_type=True), max_bytes=1 << 20)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 12), st.lists(msgpack_values, max_size=8))
def test_random_messages_never_raise_anything_else(type_number: int, fields: list[Any]) -> None:
    raw = msgpack.packb([type_number, *fields], use_bin_type=True)
    try:
        codec.decode(raw, max_bytes=1 << 20)
    except RemoteProtocolError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_manifest_bodies_never_raise_anything_else(body: bytes) -> None:
    try:
        check_manifest(decode_manifest(body, max_bytes=1 << 16), CONFIG)
    except RemoteProtocolError:
        pass


@settings(max_examples=300)
@given(msgpack_values)
def test_random_manifest_structures_never_raise_anything_else(obj: Any) -> None:
    try:
        check_manifest(
            decode_manifest(msgpack.packb([1, "r", 1, 10, 4, "xxh3_128", obj, b""]), max_bytes=1 << 16), CONFIG
        )
    except RemoteProtocolError:
        pass


# --------------------------------------------------------------------------------- manifests
def good_manifest() -> Manifest:
    specs = (
        BufferSpec(name="a", dtype="float32", shape=(4, 4), offset=0, length=64),
        BufferSpec(name="b", dtype="int64", shape=(3,), offset=64, length=24),
        BufferSpec(name="c", dtype="bfloat16", shape=(), offset=128, length=2),
    )
    return Manifest(
        run="r",
        step=3,
        total_bytes=130,
        chunk_bytes=64,
        hash_algorithm="xxh3_128",
        buffers=specs,
        chunk_hashes=bytes(16 * 3),
    )


def test_good_manifest_passes_and_round_trips() -> None:
    manifest = good_manifest()
    check_manifest(manifest, CONFIG)
    body = encode_manifest(manifest)
    assert decode_manifest(body, max_bytes=1 << 16) == manifest
    assert manifest_digest(body) == hashlib.sha256(body).digest()  # whatever the chunk hash is
    assert manifest.chunk_count == 3
    assert manifest.chunk_range(2) == (128, 2)


def with_buffer(index: int, **changes: Any) -> Manifest:
    manifest = good_manifest()
    buffers = list(manifest.buffers)
    buffers[index] = dataclasses.replace(buffers[index], **changes)
    return dataclasses.replace(manifest, buffers=tuple(buffers))


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (with_buffer(1, offset=32), "overlaps"),
        (with_buffer(2, offset=130), "outside"),
        (with_buffer(1, offset=60), "aligned"),
        (with_buffer(0, length=60), "does not match shape"),
        (with_buffer(0, shape=(4, -4)), "negative"),
        (with_buffer(0, dtype="float128"), "unknown dtype"),
        (with_buffer(1, name="a"), "twice"),
        (with_buffer(1, name=""), "name"),
        (with_buffer(1, name="n" * 2000), "name"),
        (with_buffer(0, shape=(1,) * 40, length=4), "dimensions"),
        (with_buffer(0, shape=(2**40, 2**40, 2**40), length=64), "does not match shape"),
        (dataclasses.replace(good_manifest(), chunk_hashes=bytes(16 * 2)), "chunk hashes"),
        (dataclasses.replace(good_manifest(), total_bytes=2**50), "total_bytes"),
        (dataclasses.replace(good_manifest(), chunk_bytes=0), "chunk_bytes"),
        (dataclasses.replace(good_manifest(), chunk_bytes=2**40), "chunk_bytes"),
        (dataclasses.replace(good_manifest(), hash_algorithm="md5"), "hash algorithm"),
        (dataclasses.replace(good_manifest(), run=""), "run id"),
        (dataclasses.replace(good_manifest(), step=-1), "step"),
        (dataclasses.replace(good_manifest(), buffers=good_manifest().buffers[::-1]), "overlaps"),
    ],
)
def test_inconsistent_manifests_are_rejected_clearly(manifest: Manifest, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        check_manifest(manifest, CONFIG)


def test_manifest_entry_limit() -> None:
    config = TransferConfig(max_manifest_entries=2)
    with pytest.raises(RemoteProtocolError, match="limit 2"):
        check_manifest(good_manifest(), config)


names = st.text(min_size=0, max_size=12)
specs = st.builds(
    BufferSpec,
    name=names,
    dtype=st.sampled_from([*DTYPE_ITEMSIZE, "x", ""]),
    shape=st.lists(st.integers(-3, 2**62), max_size=5).map(tuple),
    offset=st.integers(-(2**64), 2**64),
    length=st.integers(-(2**64), 2**64),
)
hostile_manifests = st.builds(
    Manifest,
    run=names,
    step=st.integers(-(2**64), 2**65),
    total_bytes=st.integers(-(2**64), 2**65),
    chunk_bytes=st.integers(-5, 2**65),
    hash_algorithm=st.sampled_from(["xxh3_128", "blake3", "", "sha1"]),
    buffers=st.lists(specs, max_size=6).map(tuple),
    chunk_hashes=st.binary(max_size=64),
)


@settings(max_examples=500)
@given(hostile_manifests)
def test_hostile_manifests_raise_only_remote_protocol_errors(manifest: Manifest) -> None:
    try:
        check_manifest(manifest, CONFIG)
    except RemoteProtocolError:
        return
    # Whatever passes must really be consistent.
    end = 0
    for spec in manifest.buffers:
        assert spec.offset >= end and spec.offset + spec.length <= manifest.total_bytes
        end = spec.offset + spec.length


@settings(max_examples=200)
@given(hostile_manifests)
def test_hostile_manifests_survive_the_wire(manifest: Manifest) -> None:
    try:
        body = encode_manifest(manifest)
    except (OverflowError, ValueError):
        return  # integers msgpack cannot carry never reach a peer
    try:
        check_manifest(decode_manifest(body, max_bytes=1 << 20), CONFIG)
    except RemoteProtocolError:
        pass


# -------------------------------------------------------------------------------------- config
def test_config_profiles_are_valid() -> None:
    for profile in (TransferConfig.local(), TransferConfig.lan(), TransferConfig.wan()):
        assert profile.chunk_bytes == 4 << 20
    assert TransferConfig.wan().stall_timeout_s > TransferConfig.local().stall_timeout_s


@pytest.mark.parametrize(
    "changes",
    [
        {"chunk_bytes": 0},
        {"chunk_bytes": 100},
        {"chunk_bytes": 128 << 20},
        {"replan_factor": 1.0},
        {"max_requests_per_source": 0},
        {"max_chunks_per_request": 0},
        {"request_target_s": -1.0},
        {"max_staging_memory_fraction": 1.5},
        {"stall_timeout_s": float("nan")},
        {"stall_timeout_s": float("inf")},
        {"hash_algorithm": "md5"},
        {"max_inflight_chunks_per_source": 0},
        {"max_leases_per_peer": 100, "max_leases": 10},
        {"lease_ttl_s": 1.0, "request_timeout_s": 2.0},
        {"max_request_bytes": 1 << 20},
        {"max_replans": -1},
    ],
)
def test_bad_config_is_a_config_error(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        TransferConfig(**changes)


def test_blake3_hash_is_32_bytes() -> None:
    pytest.importorskip("blake3")
    assert len(hash_function("blake3")(b"abc")) == 32
    with pytest.raises(ConfigError):
        hash_function("md5")


# ------------------------------------------------------------------- limits checked while decoding
def manifest_head(total: int = 130, chunk: int = 64) -> bytes:
    """The encoded manifest fields before the buffer list."""
    return b"\x98" + b"".join(msgpack.packb(v) for v in (1, "r", 3, total, chunk, "xxh3_128"))


def peak_allocation(action: Any) -> int:
    tracemalloc.start()
    try:
        action()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # a buffer list claiming 4 billion entries: refused from its 5-byte header
        (manifest_head() + b"\xdd\xff\xff\xff\xff", "limit"),
        # a shape with more dimensions than allowed
        (manifest_head() + b"\x91\x95\xa1a\xa7float32\xdc\x01\x00", "limit"),
        # a name claiming 4 GiB of text
        (manifest_head() + b"\x91\x95\xdb\xff\xff\xff\xff", "exceed"),
        # chunk hashes claiming far more bytes than the chunk count needs
        (manifest_head() + b"\x90\xc6\xff\xff\xff\xff", "chunk count needs 48"),
        # a snapshot larger than max_state_bytes, refused before the buffers are read
        (manifest_head(total=2**50) + b"\xdd\xff\xff\xff\xff", "total_bytes"),
        # an array where the run id belongs (msgpack would otherwise build it)
        (b"\x98\x01\xdd\xff\xff\xff\xff", "expected str"),
    ],
)
def test_manifest_counts_are_checked_before_anything_is_built(body: bytes, message: str) -> None:
    def decode() -> None:
        with pytest.raises(RemoteProtocolError, match=message):
            decode_manifest(body, max_bytes=1 << 20)

    assert peak_allocation(decode) < 256 << 10


def test_manifest_limits_come_from_the_config() -> None:
    body = encode_manifest(good_manifest())
    assert decode_manifest(body, max_bytes=1 << 16, limits=CONFIG) == good_manifest()
    with pytest.raises(RemoteProtocolError, match="3 items \\(limit 2\\)"):
        decode_manifest(body, max_bytes=1 << 16, limits=TransferConfig(max_manifest_entries=2))
    with pytest.raises(RemoteProtocolError, match="total_bytes"):
        decode_manifest(body, max_bytes=1 << 16, limits=TransferConfig(max_state_bytes=100))
    with pytest.raises(RemoteProtocolError, match="trailing"):
        decode_manifest(body + b"\x00", max_bytes=1 << 16)


def test_control_frames_are_decoded_with_the_protocols_own_limits() -> None:
    version = [1, 1, 1, "xxh3_128", DIGEST]
    assert decode_message(msgpack.packb([2, 1, "r", [version] * 64]))  # a full version list is fine
    # 65 versions are refused by the decoder itself (array limit), not after building them
    with pytest.raises(RemoteProtocolError, match="undecodable"):
        decode_message(msgpack.packb([2, 1, "r", [version] * 65]))
    for hostile in (
        b"\x94\x02\x01\xa1r\xdd\xff\xff\xff\xff",  # versions array claiming 4 billion items
        b"\x92\x0a\xc6\x00\x10\x00\x00" + bytes(10),  # a 1 MiB bin where an id belongs
        b"\x81\x01\x02",  # maps are never part of a transfer message
    ):

        def decode(body: bytes = hostile) -> None:
            with pytest.raises(RemoteProtocolError):
                decode_message(body)

        assert peak_allocation(decode) < 64 << 10
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decode_message(bytes(WIRE_MAX_FRAME_BYTES + 1))
