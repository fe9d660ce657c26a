"""A newcomer that falls behind is cut off once: removed and reset at once, not warned about every step."""

from __future__ import annotations

import logging
from typing import Any, cast

import numpy as np
import pytest

from chaosp2p.training.feed import UpdateFeed
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import Identity


class StuckStream:
    """A stream whose sender never gets to send (its serve task is blocked; here: never started)."""

    def __init__(self) -> None:
        self.remote_peer = Identity.generate().peer_id
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


def test_a_stuck_observer_is_cut_off_once(caplog: pytest.LogCaptureFixture) -> None:
    feed = UpdateFeed(max_queued=2)
    stream = StuckStream()
    feed.watch(cast(Stream, cast(Any, stream)))
    update = np.zeros(4, dtype=np.float32)
    with caplog.at_level(logging.WARNING, logger="chaosp2p.training"):
        for step in range(10):
            feed.publish(step=step, epoch=0, config_digest=b"\0" * 32, update=update)
    assert feed.cut_off == 1 and feed.observing == 0
    assert stream.resets >= 1  # the blocked send fails now, not after the stream drains
    assert len([r for r in caplog.records if "cut off" in r.getMessage()]) == 1
