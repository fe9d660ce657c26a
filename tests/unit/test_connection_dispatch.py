"""The connection's dispatch tables cover every record type and every mux verdict."""

from __future__ import annotations

import re
from pathlib import Path

from chaosp2p.protocols.channel import mux
from chaosp2p.protocols.channel.record_layer import FrameType, GoAwayCode
from chaosp2p.transport.connection import reader

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "wire.md"


def test_every_record_type_but_data_has_a_handler() -> None:
    # DATA is dispatched before the table (the bulk path); every other type must be in it.
    assert set(reader._CONNECTION_RECORDS) == set(FrameType) - {FrameType.DATA}


def test_every_mux_verdict_on_data_has_a_handler() -> None:
    assert set(reader._STREAM_EVENTS) | {mux.DataReceived} == {
        mux.DataReceived,
        mux.StreamRefused,
        mux.StreamWasReset,
        mux.Ignored,
    }


def test_goaway_codes_match_the_spec() -> None:
    text = " ".join(SPEC.read_text().split())
    listed = re.search(r"GOAWAY carries a code in `value` \(([^)]*)\)", text)
    assert listed is not None
    in_spec = {int(number): name for number, name in re.findall(r"(\d) ([a-z ]+)", listed.group(1))}
    assert in_spec == {code.value: code.name.lower().replace("_", " ") for code in GoAwayCode}
