"""``hivemind.dht.validation``: record validators, with hivemind's interface and combination rules.

A validator sees each DHT entry as a :class:`DHTRecord` (the key's id, the serialized subkey, the
serialized value, the expiration) and may sign values on the way in and check and strip them on
the way out. The drop-in calls them where hivemind does: ``sign_value`` when this peer stores,
``validate`` then ``strip_value`` for every entry a ``get`` returns (an entry that fails is dropped,
as hivemind drops a record a peer returns that fails). A store that fails its own validators is
refused (``store`` returns False), as hivemind's peers refuse to store it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from chaosp2p.hivemind.utils.serializer import MSGPackSerializer

IS_REGULAR_VALUE = MSGPackSerializer.dumps(None)
"""The subkey of a value stored without one (hivemind's tag)."""


def dht_key_id(key: Any) -> bytes:
    """The id of a DHT key, as a validator sees it in ``DHTRecord.key`` (SHA-1 of the serialized key)."""
    return hashlib.sha1(MSGPackSerializer.dumps(key)).digest()


@dataclasses.dataclass(init=True, repr=True, frozen=True)
class DHTRecord:
    """One DHT entry as validators see it."""

    key: bytes
    subkey: bytes
    value: bytes
    expiration_time: float


class RecordValidatorBase(ABC):
    """A check (and optionally a signature) on DHT records; combine several in a :class:`CompositeValidator`."""

    @abstractmethod
    def validate(self, record: DHTRecord) -> bool:
        """Whether ``record`` (with its signature, if any) is acceptable."""

    def sign_value(self, record: DHTRecord) -> bytes:
        """``record.value`` with whatever this validator adds (nothing by default)."""
        return record.value

    def strip_value(self, record: DHTRecord) -> bytes:
        """``record.value`` without what :meth:`sign_value` added (after a successful validate)."""
        return record.value

    @property
    def priority(self) -> int:
        """Signing runs in increasing priority, validating and stripping in decreasing priority."""
        return 0

    def merge_with(self, other: RecordValidatorBase) -> bool:
        """Absorb ``other`` into this validator and return True, or leave both alone and return False."""
        return False


class CompositeValidator(RecordValidatorBase):
    """Several validators applied as one, merged and ordered as hivemind does."""

    def __init__(self, validators: Iterable[RecordValidatorBase] = ()) -> None:
        self._validators: list[RecordValidatorBase] = []
        self.extend(validators)

    def extend(self, validators: Iterable[RecordValidatorBase]) -> None:
        """Add validators (merged into an existing one where it accepts them)."""
        for validator in validators:
            if not isinstance(validator, RecordValidatorBase):
                raise TypeError(f"record_validators must be RecordValidatorBase instances, not {type(validator)}")
            if not any(existing.merge_with(validator) for existing in self._validators):
                self._validators.append(validator)
        self._validators.sort(key=lambda validator: validator.priority)

    def __bool__(self) -> bool:
        return bool(self._validators)

    def validate(self, record: DHTRecord) -> bool:
        """All validators accept (each sees the value with the outer validators' additions stripped)."""
        ordered = list(reversed(self._validators))
        for index, validator in enumerate(ordered):
            if not validator.validate(record):
                return False
            if index < len(ordered) - 1:
                record = dataclasses.replace(record, value=validator.strip_value(record))
        return True

    def sign_value(self, record: DHTRecord) -> bytes:
        """The value signed by every validator, lowest priority first."""
        for validator in self._validators:
            record = dataclasses.replace(record, value=validator.sign_value(record))
        return record.value

    def strip_value(self, record: DHTRecord) -> bytes:
        """The value with every validator's additions removed, highest priority first."""
        for validator in reversed(self._validators):
            record = dataclasses.replace(record, value=validator.strip_value(record))
        return record.value


__all__ = ["IS_REGULAR_VALUE", "CompositeValidator", "DHTRecord", "RecordValidatorBase", "dht_key_id"]
