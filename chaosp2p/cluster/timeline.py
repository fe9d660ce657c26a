"""One timeline for a cluster run: the harness's own actions and every peer's records, on one clock.

Every record of ``DIR/timeline.jsonl`` is one JSON object with ``t``, seconds since the harness
started on the machine's monotonic clock (the churn schedule's zero, when every initial peer was
listening, is the ``schedule`` record's ``t``), and ``source``:
``"harness"`` or a peer's name. Harness records carry ``event`` (``started``, ``ready``,
``inject``, ``exited``, ``stopped``, ...); a peer's records carry the line the peer wrote to its
metrics file under ``record``, unchanged, plus ``seen_t`` (when the harness read it).

Why one clock works: all peers run on this machine, and Linux' ``CLOCK_MONOTONIC`` (Python's
:func:`time.monotonic`) is shared by every process on it. Peers stamp runtime events with it
(``at``, ``detected_at``, ``proposed_at``, ``committed_at``) and step records with wall time
(``time``), which is mapped through the wall-minus-monotonic offset measured at the start. A record
with neither is placed when the harness read it (it tails the files every ``poll`` call, so that is
at most one poll interval late). Derived times keep their names with ``_t`` for ``_at``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

TIMELINE_NAME = "timeline.jsonl"

_MONOTONIC_KEYS = ("detected_at", "proposed_at", "committed_at", "suspected_at")


class TimelineWriter:
    """Collects harness records and tails peers' metrics files into ``timeline.jsonl``.

    Records are appended as they arrive (a run cut short still leaves its timeline behind) and the
    file is rewritten sorted by ``t`` on :meth:`close`.
    """

    def __init__(self, path: Path, *, zero_mono: float | None = None) -> None:
        self.path = path
        self.zero_mono = time.monotonic() if zero_mono is None else zero_mono
        self.wall_minus_mono = time.time() - time.monotonic()
        self._records: list[dict[str, Any]] = []
        self._file: IO[str] | None = path.open("w")
        self._tails: dict[str, tuple[Path, int, bytes]] = {}  # name -> (file, offset, partial line)
        self._peer_ids: dict[str, str] = {}

    def now(self) -> float:
        """Seconds since time zero."""
        return time.monotonic() - self.zero_mono

    def mono_to_t(self, mono: float) -> float:
        """A monotonic reading as timeline time."""
        return mono - self.zero_mono

    def wall_to_t(self, wall: float) -> float:
        """A wall-clock reading as timeline time."""
        return wall - self.wall_minus_mono - self.zero_mono

    def harness(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record something the harness did or saw, now."""
        record = {"t": round(self.now(), 6), "source": "harness", "event": event, **fields}
        self._append(record)
        return record

    def follow(self, name: str, metrics: Path) -> None:
        """Tail ``metrics`` (a peer's JSON-lines file) from now on under ``name``."""
        self._tails[name] = (metrics, 0, b"")

    def set_peer_id(self, name: str, peer_id: str) -> None:
        """Name the PeerID of peer ``name`` (added to its records)."""
        self._peer_ids[name] = peer_id

    def poll(self) -> int:
        """Read every complete new line of the tailed files; return how many records were added."""
        added = 0
        for name, (path, offset, partial) in list(self._tails.items()):
            try:
                with path.open("rb") as file:
                    file.seek(offset)
                    chunk = file.read()
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            data = partial + chunk
            lines = data.split(b"\n")
            self._tails[name] = (path, offset + len(chunk), lines[-1])
            seen = round(self.now(), 6)
            for line in lines[:-1]:
                if line.strip():
                    self._append(self.peer_record(name, line, seen))
                    added += 1
        return added

    def peer_record(self, name: str, line: bytes, seen_t: float) -> dict[str, Any]:
        """One metrics line of peer ``name`` as a timeline record."""
        try:
            record = json.loads(line)
        except ValueError:
            record = {"unparsed": line.decode("utf-8", "replace")}
        if not isinstance(record, dict):
            record = {"value": record}
        entry: dict[str, Any] = {"t": seen_t, "seen_t": seen_t, "source": name, "record": record}
        if name in self._peer_ids:
            entry["peer_id"] = self._peer_ids[name]
        if isinstance(record.get("at"), (int, float)):
            entry["t"] = round(self.mono_to_t(record["at"]), 6)
        elif isinstance(record.get("time"), (int, float)):
            entry["t"] = round(self.wall_to_t(record["time"]), 6)
        for key in _MONOTONIC_KEYS:
            if isinstance(record.get(key), (int, float)):
                entry[key[: -len("_at")] + "_t"] = round(self.mono_to_t(record[key]), 6)
        if "committed_t" in entry and "at" not in record and "time" not in record:
            entry["t"] = entry["committed_t"]
        return entry

    def _append(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record so far, in arrival order."""
        return list(self._records)

    def close(self) -> Path:
        """Read what is left, rewrite the file sorted by ``t`` and return its path."""
        self.poll()
        if self._file is not None:
            self._file.close()
            self._file = None
        ordered = sorted(self._records, key=lambda r: r["t"])
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text("".join(json.dumps(r) + "\n" for r in ordered))
        temporary.replace(self.path)
        return self.path


def read_timeline(path: Path | str) -> list[dict[str, Any]]:
    """The records of a ``timeline.jsonl`` (a torn last line, from a run killed mid-write, is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("t"), (int, float)):
            records.append(record)
    return records
