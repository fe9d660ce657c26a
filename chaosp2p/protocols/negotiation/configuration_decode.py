"""Reading a configuration from the wire: every field checked, then the digest recomputed.

A newcomer receives the configuration it is admitted into (and a lagging member the one it
missed) as the canonical 12-item array of ``run_configuration.py`` followed by its digest. Nothing
a peer sends is trusted: counts are checked against the caps before anything is built, every
column's types and ranges are checked, members and links must be sorted and distinct, and the
digest is recomputed from the content (:func:`decode_configuration`). A newcomer decodes a
configuration of ~1000 members on its critical path, so each column is checked in one pass and
walked again only to name what is wrong.
"""

from __future__ import annotations

import math
from typing import Any

from chaosp2p.protocols.negotiation.config import MAX_STEP
from chaosp2p.protocols.negotiation.operations import (
    DIGEST_BYTES,
    WIRE_MAX_LINKS,
    WIRE_MAX_MEMBERS,
    WIRE_MAX_RATE,
    WIRE_MAX_RTT_S,
    check_count,
    check_number,
    check_run,
    check_uint,
    reject,
)
from chaosp2p.protocols.negotiation.run_configuration import (
    Configuration,
    DepartedEntry,
    LinkEntry,
    RunParams,
    make_configuration,
)
from chaosp2p.wire.framing import unpack
from chaosp2p.wire.identity import PeerID


def _uints(values: list[Any]) -> bool:
    """Are all ``values`` ints in [0, MAX_STEP]? (column-wise: bools are not ints here)"""
    return set(map(type, values)) <= {int} and (not values or (min(values) >= 0 and max(values) <= MAX_STEP))


def _admitted(params: list[Any], max_members: int) -> tuple[PeerID, ...]:
    """A closed run's admission list (the params' 4th item; none: an open run), count-checked
    before anything is built. An empty list is not canonical (an open run omits the item)."""
    if len(params) == 3:
        return ()
    listed = params[3]
    if not isinstance(listed, list) or not listed:
        raise reject("admitted peers must be a non-empty array")
    check_count(len(listed), min(max_members, WIRE_MAX_MEMBERS), "admitted peers")
    try:
        return PeerID.from_raws(listed)
    except ValueError:
        raise reject("admitted peer is not a PeerID") from None


def decode_configuration(raw: bytes, *, max_members: int, max_links: int) -> Configuration:
    """Decode and check a configuration from the wire; a bad one is a RemoteProtocolError.

    Counts are checked before anything is built, and the digest is recomputed: a configuration
    whose digest does not match its content is refused.
    """
    obj = unpack(raw, max_bytes=len(raw))
    if not isinstance(obj, list) or len(obj) != 12:
        raise reject("configuration must be an array of 12 items")
    run, epoch, step, raws, incs, thrs, since, links, params, seed, gone, digest = obj
    if type(run) is not str or type(epoch) is not int or type(step) is not int or type(seed) is not int:
        raise reject("configuration header has wrong types")
    check_run(run)
    check_uint(epoch, "epoch")
    check_uint(step, "activation_step")
    if not 0 <= seed < (1 << 63):
        raise reject("seed out of range")
    if type(digest) is not bytes or len(digest) != DIGEST_BYTES:
        raise reject("digest must be 32 bytes")
    for column in (raws, incs, thrs, since, links, params, gone):
        if not isinstance(column, list):
            raise reject("configuration columns must be arrays")
    check_count(len(raws), min(max_members, WIRE_MAX_MEMBERS), "members")
    check_count(len(links), min(max_links, WIRE_MAX_LINKS), "links")
    check_count(len(gone), WIRE_MAX_MEMBERS, "departed members")
    n = len(raws)
    if not (len(incs) == len(thrs) == len(since) == n):
        raise reject("configuration columns differ in length")
    try:
        peers = PeerID.from_raws(raws)
    except ValueError:
        raise reject("configuration member is not a PeerID") from None
    if raws != sorted(raws) or len(set(raws)) != n:
        raise reject("members must be sorted and distinct")
    # A newcomer decodes a configuration of ~1000 members on its critical path: check each column
    # in one pass, and only on failure walk it again for the precise reason.
    if not _uints(incs):
        for value in incs:
            if type(value) is not int:
                raise reject("incarnation must be an int")
            check_uint(value, "incarnation")
    if not (set(map(type, thrs)) <= {float} and all(map(math.isfinite, thrs))) or (
        thrs and not 0.0 <= min(thrs) <= max(thrs) <= WIRE_MAX_RATE
    ):
        for value in thrs:
            if type(value) is not float:
                raise reject("throughput must be a float")
            check_number(value, WIRE_MAX_RATE, "throughput")
    if not _uints(since):
        for value in since:
            if type(value) is not int:
                raise reject("since step must be an int")
            check_uint(value, "since step")
    link_entries = []
    previous = b""
    for item in links:
        if not (isinstance(item, list) and len(item) == 5):
            raise reject("link must be an array of 5")
        a, b, up, bw, rtt = item
        if type(a) is not bytes or type(b) is not bytes or type(up) is not bool:
            raise reject("link has wrong types")
        if type(bw) is not float or type(rtt) is not float:
            raise reject("link figures must be floats")
        check_number(bw, WIRE_MAX_RATE, "bandwidth")
        check_number(rtt, WIRE_MAX_RTT_S, "rtt")
        if not a < b or not previous < a + b:
            raise reject("links must be sorted, with a < b")
        previous = a + b
        try:
            link_entries.append(LinkEntry(a=PeerID(a), b=PeerID(b), up=up, bandwidth_bytes_per_s=bw, rtt_s=rtt))
        except ValueError:
            raise reject("link endpoint is not a PeerID") from None
    if (
        len(params) not in (3, 4)
        or type(params[0]) is not int
        or type(params[1]) is not str
        or type(params[2]) is not int
    ):
        raise reject("run params must be [int, str, int] or [int, str, int, [PeerID]]")
    run_params = RunParams(
        global_batch=params[0], mode=params[1], local_steps=params[2], admitted=_admitted(params, max_members)
    )
    run_params.validate()
    departed = []
    previous = b""
    for item in gone:
        if not (isinstance(item, list) and len(item) == 4 and type(item[0]) is bytes):
            raise reject("departed entry must be [PeerID, int, int, int]")
        if any(type(v) is not int for v in item[1:]) or not previous < item[0]:
            raise reject("departed entries must be sorted, with int fields")
        for value, what in zip(item[1:], ("incarnation", "epoch", "activation step"), strict=True):
            check_uint(value, f"departed {what}")
        previous = item[0]
        try:
            departed.append(
                DepartedEntry(peer_id=PeerID(item[0]), incarnation=item[1], epoch=item[2], activation_step=item[3])
            )
        except ValueError:
            raise reject("departed entry is not a PeerID") from None
    config = make_configuration(
        run=run,
        epoch=epoch,
        activation_step=step,
        peers=peers,
        incarnations=incs,
        throughputs=thrs,
        links=link_entries,
        params=run_params,
        seed=seed,
        since_steps=since,
        departed=departed,
        ids=raws,
    )
    if config.digest != digest:
        raise reject("configuration digest does not match its content")
    return config


__all__ = ["decode_configuration"]
