"""``hivemind.dht.schema``: restrict DHT keys to a pydantic schema, as hivemind's ``SchemaValidator`` does.

The schema is a pydantic v1 model (``from pydantic.v1 import BaseModel``, as hivemind's own
schemas and albert's are); each field names a DHT key (``prefix + "_" + field``) and types its
value, or with ``Dict[subkey type, value type]`` its subkeys. A value that fails, or that pydantic
would have to convert, is refused. chaosp2p does not depend on pydantic: the pydantic a schema was
built with is imported when the validator is made.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from chaosp2p.errors import ConfigError
from chaosp2p.hivemind.dht.crypto import RSASignatureValidator
from chaosp2p.hivemind.dht.validation import IS_REGULAR_VALUE, DHTRecord, RecordValidatorBase, dht_key_id
from chaosp2p.hivemind.utils.logging import get_logger
from chaosp2p.hivemind.utils.serializer import MSGPackSerializer

logger = get_logger(__name__)


def _pydantic_v1_of(schema: Any) -> ModuleType:
    """The pydantic v1 API ``schema`` was built with (``pydantic.v1`` of pydantic 2, or pydantic 1)."""
    kind = type(schema).__module__
    if kind.startswith("pydantic.v1"):
        return importlib.import_module("pydantic.v1")
    if kind.startswith("pydantic") and hasattr(schema, "__fields__") and not hasattr(schema, "model_fields"):
        return importlib.import_module("pydantic")
    raise ConfigError(
        "SchemaValidator takes a pydantic v1 model class (from pydantic.v1 import BaseModel), as hivemind's does"
    )


class SchemaValidator(RecordValidatorBase):
    """Check the values of the keys a pydantic schema names (see the module docstring)."""

    def __init__(self, schema: Any, allow_extra_keys: bool = True, prefix: str | None = None) -> None:
        self._pydantic = _pydantic_v1_of(schema)
        self._patch_schema(schema)
        self._schemas = [schema]
        self._key_id_to_field_name: dict[bytes, str] = {}
        for field in schema.__fields__.values():
            raw_key = f"{prefix}_{field.name}" if prefix is not None else field.name
            self._key_id_to_field_name[dht_key_id(raw_key)] = field.name
        self._allow_extra_keys = allow_extra_keys

    def _patch_schema(self, schema: Any) -> None:
        # validate() checks one key at a time: no field is required, and no other may appear
        for field in schema.__fields__.values():
            field.required = False
        schema.__config__.extra = self._pydantic.Extra.forbid

    def validate(self, record: DHTRecord) -> bool:
        """The entry's value fits the schema without any conversion (keys the schema lacks: ``allow_extra_keys``)."""
        if record.key not in self._key_id_to_field_name:
            return self._allow_extra_keys
        try:
            value = self._deserialize_record(record)
        except ValueError as exc:
            logger.debug("%s", exc)
            return False
        [field_name] = list(value)
        errors: list[Exception] = []
        for schema in self._schemas:
            try:
                parsed = schema.parse_obj(value)
            except self._pydantic.ValidationError as exc:
                if not self._failed_on_extra_field(exc):
                    errors.append(exc)
                continue
            if parsed.dict(by_alias=True)[field_name] != value[field_name]:
                errors.append(ValueError(f"{value} would need type conversions to match the schema"))
            else:
                return True
        logger.debug("DHT record %s matches no schema: %s", record, errors)
        return False

    def _deserialize_record(self, record: DHTRecord) -> dict[str, Any]:
        field_name = self._key_id_to_field_name[record.key]
        try:
            value = MSGPackSerializer.loads(record.value)
            if record.subkey not in (IS_REGULAR_VALUE, b""):
                return {field_name: {MSGPackSerializer.loads(record.subkey): value}}
        except Exception as exc:  # whatever a hostile writer's bytes raise while unpacking
            raise ValueError(f"undecodable DHT record {record}: {exc}") from None
        if isinstance(value, dict):
            raise ValueError(f"DHT record {record} holds a dict without subkeys; store one subkey per entry")
        return {field_name: value}

    @staticmethod
    def _failed_on_extra_field(exc: Any) -> bool:
        errors = exc.errors()
        return len(errors) == 1 and errors[0]["type"] == "value_error.extra" and len(errors[0]["loc"]) == 1

    def merge_with(self, other: RecordValidatorBase) -> bool:
        """Schema validators combine: a record passes if any one schema accepts it."""
        if not isinstance(other, SchemaValidator):
            return False
        self._schemas.extend(other._schemas)
        self._key_id_to_field_name.update(other._key_id_to_field_name)
        self._allow_extra_keys = self._allow_extra_keys or other._allow_extra_keys
        return True


def conbytes(*, regex: bytes | None = None, min_length: int | None = None, max_length: int | None = None) -> type:
    """A pydantic (v1) field type for bytes matching ``regex`` and the length bounds."""
    compiled = re.compile(regex) if regex is not None else None

    class ConstrainedBytes(bytes):
        @classmethod
        def __get_validators__(cls) -> Iterator[Callable[[Any], bytes]]:
            yield cls.check

        @classmethod
        def check(cls, value: Any) -> bytes:
            if not isinstance(value, bytes):
                raise TypeError("bytes required")
            if min_length is not None and len(value) < min_length:
                raise ValueError(f"at least {min_length} bytes required")
            if max_length is not None and len(value) > max_length:
                raise ValueError(f"at most {max_length} bytes allowed")
            if compiled is not None and compiled.match(value) is None:
                raise ValueError(f"value {value!r} does not match {regex!r}")
            return value

    return ConstrainedBytes


BytesWithPublicKey = conbytes(regex=b".*" + RSASignatureValidator.PUBLIC_KEY_REGEX + b".*")
"""Bytes that contain an owner marker (``[owner:...]``): a subkey only its owner can write."""

__all__ = ["BytesWithPublicKey", "SchemaValidator", "conbytes"]
