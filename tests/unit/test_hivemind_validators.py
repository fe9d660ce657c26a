"""hivemind's record validators on the drop-in: owner signatures on Ed25519, pydantic schemas (issue 22, item 1).

albert's ``utils.make_validators`` builds exactly these: a ``SchemaValidator`` for the metrics key
(subkeys must carry an owner marker, values must match ``LocalMetrics``) and an
``RSASignatureValidator`` (only the owner may write an entry under its marker).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from chaosp2p.hivemind.dht.crypto import RSASignatureValidator
from chaosp2p.hivemind.dht.validation import IS_REGULAR_VALUE, CompositeValidator, DHTRecord, dht_key_id
from chaosp2p.hivemind.utils.serializer import MSGPackSerializer
from chaosp2p.wire.identity import Identity


def record(key: Any, subkey: Any, value: Any, expiration: float = 99.0) -> DHTRecord:
    subkey_bytes = IS_REGULAR_VALUE if subkey is None else MSGPackSerializer.dumps(subkey)
    return DHTRecord(dht_key_id(key), subkey_bytes, MSGPackSerializer.dumps(value), expiration)


def test_only_the_owner_can_sign_an_entry_under_its_marker() -> None:
    owner, other = RSASignatureValidator(Identity.generate()), RSASignatureValidator(Identity.generate())
    entry = record("run_metrics", owner.local_public_key, {"loss": 1.0})
    signed = dataclasses.replace(entry, value=owner.sign_value(entry))
    assert signed.value != entry.value
    assert owner.validate(signed) and other.validate(signed)  # anyone can check it
    assert owner.strip_value(signed) == entry.value
    forged = dataclasses.replace(entry, value=other.sign_value(entry))  # not other's marker: left unsigned
    assert forged.value == entry.value and not owner.validate(forged)
    tampered = dataclasses.replace(signed, expiration_time=entry.expiration_time + 1)
    assert not owner.validate(tampered)


def test_entries_without_a_marker_pass_and_two_owners_in_one_entry_fail() -> None:
    a, b = RSASignatureValidator(Identity.generate()), RSASignatureValidator(Identity.generate())
    assert a.validate(record("plain", None, 1))
    both = DHTRecord(a.local_public_key, b.local_public_key, b"v", 1.0)
    assert not a.validate(dataclasses.replace(both, value=a.sign_value(both)))


def test_validators_are_merged_and_ordered_as_in_hivemind() -> None:
    first, second = RSASignatureValidator(Identity.generate()), RSASignatureValidator(Identity.generate())
    composite = CompositeValidator([first, second])
    assert len(composite._validators) == 1  # one signature validator is enough
    assert RSASignatureValidator().local_public_key == RSASignatureValidator().local_public_key  # process-wide


def test_albert_s_metric_schema_accepts_its_metrics_and_refuses_anything_else() -> None:
    pydantic = pytest.importorskip("pydantic.v1")
    from chaosp2p.hivemind.dht.schema import BytesWithPublicKey, SchemaValidator

    # albert's utils.LocalMetrics / MetricSchema (create_model: this module's annotations are strings)
    local_metrics = pydantic.create_model(
        "LocalMetrics", step=(pydantic.conint(ge=0, strict=True), ...), loss=(pydantic.StrictFloat, ...)
    )
    metric_schema = pydantic.create_model("MetricSchema", metrics=(dict[BytesWithPublicKey, local_metrics], ...))

    signer = RSASignatureValidator(Identity.generate())
    validators = CompositeValidator([SchemaValidator(metric_schema, prefix="run"), signer])
    key = signer.local_public_key

    def check(subkey: Any, value: Any, name: str = "run_metrics") -> bool:
        entry = record(name, subkey, value)
        return validators.validate(dataclasses.replace(entry, value=validators.sign_value(entry)))

    assert check(key, {"step": 3, "loss": 0.5})
    assert not check(key, {"step": -1, "loss": 0.5})  # out of range
    assert not check(key, {"step": 3, "loss": 1})  # an int where a float must be: no conversions
    assert not check(b"no owner marker", {"step": 3, "loss": 0.5})  # subkeys must name an owner
    assert not check(None, {"step": 3, "loss": 0.5})  # the metrics key takes subkeys only
    assert check(key, "anything", name="another_key")  # keys the schema does not name pass


def test_a_schema_that_is_not_a_pydantic_v1_model_is_refused() -> None:
    from chaosp2p.errors import ConfigError
    from chaosp2p.hivemind.dht.schema import SchemaValidator

    with pytest.raises(ConfigError, match="pydantic v1"):
        SchemaValidator(dict)
