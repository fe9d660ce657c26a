"""Typed messages and their strict msgpack schema.

Each protocol owns a :class:`MessageCodec` and an append-only ``IntEnum`` of message types (as
memberlist's ``net.go`` says of its own list: ONLY APPEND, never renumber). A message is a frozen,
slotted, keyword-only dataclass registered under one type number. On the wire a message is the
msgpack array ``[type, field1, field2, ...]`` in declaration order: compact (no field names) and
forward compatible (a newer peer may append fields; an older peer ignores extra trailing items, and
fields with defaults may be missing).

Decoding checks every field against its annotation -- exact types (``True`` is not an int), enum
membership, tuple element types, nested messages -- and then the class's own ``validate()`` for
value rules (sizes, ranges). Whatever fails is a :class:`RemoteProtocolError`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.framing import pack, unpack
from chaosp2p.wire.identity import PeerID

M = TypeVar("M", bound="Message")
T = TypeVar("T")


class Message:
    """Base of all wire messages; subclasses are frozen kw-only dataclasses registered on a codec."""

    __slots__ = ()
    TYPE: ClassVar[int]

    def validate(self) -> None:
        """Value checks beyond types (override; raise :class:`RemoteProtocolError`)."""


Checker = Callable[[Any, str], Any]
FieldSpec = tuple[str, Checker, bool]  # (name, checker, has a default)


def _field_specs(cls: type) -> tuple[FieldSpec, ...]:
    """How to check each field of dataclass ``cls``, in declaration (= wire) order."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            f.name,
            _checker_for(hints[f.name]),
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )


def _build(cls: type[T], fields: tuple[FieldSpec, ...], values: list[Any], where: str) -> T:
    """Check ``values`` against ``fields``, construct ``cls`` and run its ``validate()``."""
    kwargs: dict[str, Any] = {}
    for index, (name, check, has_default) in enumerate(fields):
        if index >= len(values):
            if has_default:
                continue
            raise RemoteProtocolError(f"{where}: missing field {name!r}")
        kwargs[name] = check(values[index], f"{where}.{name}")
    try:
        item = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError(f"{where}: invalid {cls.__name__}: {exc}") from None
    validate = getattr(item, "validate", None)
    if validate is not None:
        validate()
    return item


class MessageCodec:
    """Encoder/decoder for one protocol's messages."""

    def __init__(self, protocol: str, types_enum: type[enum.IntEnum]) -> None:
        self.protocol = protocol
        self.types_enum = types_enum
        self._classes: dict[int, type[Message]] = {}
        self._fields: dict[type[Message], tuple[FieldSpec, ...]] = {}

    def register(self, type_number: enum.IntEnum) -> Callable[[type[M]], type[M]]:
        """Class decorator: register a message dataclass under ``type_number``."""

        def wrap(cls: type[M]) -> type[M]:
            if not isinstance(type_number, self.types_enum):
                raise TypeError(f"{type_number!r} is not a {self.types_enum.__name__}")
            if int(type_number) in self._classes:
                raise TypeError(f"message type {type_number!r} registered twice")
            if not dataclasses.is_dataclass(cls):
                raise TypeError(f"{cls.__name__} must be a dataclass")
            cls.TYPE = int(type_number)
            self._classes[int(type_number)] = cls
            self._fields[cls] = _field_specs(cls)
            return cls

        return wrap

    def to_obj(self, msg: Message) -> list[Any]:
        """The msgpack-ready array form of ``msg``."""
        fields = self._fields.get(type(msg))
        if fields is None:
            raise TypeError(f"{type(msg).__name__} is not registered with the {self.protocol} codec")
        return [msg.TYPE, *(_to_wire(getattr(msg, name)) for name, _, _ in fields)]

    def encode(self, msg: Message) -> bytes:
        """msgpack bytes of ``msg`` (without a length prefix)."""
        return pack(self.to_obj(msg))

    def from_obj(self, obj: Any) -> Message:
        """Validate a decoded msgpack object and build the message it describes."""
        if not isinstance(obj, list) or not obj:
            raise RemoteProtocolError(f"{self.protocol}: a message must be a non-empty array")
        type_number = obj[0]
        if type(type_number) is not int:
            raise RemoteProtocolError(f"{self.protocol}: message type must be an integer")
        cls = self._classes.get(type_number)
        if cls is None:
            raise RemoteProtocolError(f"{self.protocol}: unknown message type {type_number}")
        return _build(cls, self._fields[cls], obj[1:], f"{self.protocol}: {cls.__name__}")

    def decode(self, body: bytes | memoryview, *, max_bytes: int) -> Message:
        """Decode msgpack bytes (no length prefix) into a validated message."""
        return self.from_obj(unpack(body, max_bytes=max_bytes))

    def message_classes(self) -> dict[int, type[Message]]:
        """The registered classes by type number (for docs and test vectors)."""
        return dict(self._classes)


_PLAIN = frozenset({bytes, int, str, float, bool, type(None)})
"""Types msgpack takes as they are, matched exactly (an IntEnum member's type is its enum class)."""

_DATACLASS_FIELDS: dict[type, tuple[str, ...]] = {}
"""Field names per nested dataclass type, looked up once instead of per value encoded."""


def _to_wire(value: Any) -> Any:
    # Most values are plain: one set lookup instead of four isinstance checks and is_dataclass
    # (every message of every protocol goes through here; heartbeats carry dozens of fields).
    cls = type(value)
    if cls in _PLAIN:
        return value
    if cls is PeerID:
        return value.raw
    if isinstance(value, (tuple, list)):
        return [_to_wire(v) for v in value]
    if isinstance(value, PeerID):
        return value.raw
    if isinstance(value, enum.IntEnum):
        return int(value)
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    names = _DATACLASS_FIELDS.get(cls)
    if names is None:
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            return value
        names = _DATACLASS_FIELDS[cls] = tuple(f.name for f in dataclasses.fields(value))
    return [_to_wire(getattr(value, name)) for name in names]


def _fail(where: str, expected: str, value: Any) -> typing.NoReturn:
    raise RemoteProtocolError(f"{where}: expected {expected}, got {type(value).__name__}")


def _checker_for(hint: Any) -> Checker:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        allows_none = type(None) in options
        rest = [o for o in options if o is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"unsupported union {hint!r}")
        inner = _checker_for(rest[0])

        def check_optional(value: Any, where: str) -> Any:
            if value is None and allows_none:
                return None
            return inner(value, where)

        return check_optional
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            element = _checker_for(args[0])

            def check_tuple(value: Any, where: str) -> Any:
                if not isinstance(value, list):
                    _fail(where, "array", value)
                return tuple(element(v, f"{where}[{i}]") for i, v in enumerate(value))

            return check_tuple
        elements = [_checker_for(a) for a in args]

        def check_fixed_tuple(value: Any, where: str) -> Any:
            if not isinstance(value, list) or len(value) != len(elements):
                _fail(where, f"array of {len(elements)}", value)
            return tuple(c(v, f"{where}[{i}]") for i, (c, v) in enumerate(zip(elements, value, strict=True)))

        return check_fixed_tuple
    if origin is dict:
        key_check, value_check = (_checker_for(a) for a in get_args(hint))

        def check_dict(value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                _fail(where, "map", value)
            return {key_check(k, f"{where} key"): value_check(v, f"{where}[{k!r}]") for k, v in value.items()}

        return check_dict
    if hint is Any:
        return lambda value, where: value
    if isinstance(hint, type):
        if hint is bool:
            return _exact(bool)
        if hint is int:
            return _exact(int)
        if hint is str:
            return _exact(str)
        if hint is bytes:
            return _exact(bytes)
        if hint is float:

            def check_float(value: Any, where: str) -> float:
                if type(value) not in (float, int):
                    _fail(where, "number", value)
                return float(value)

            return check_float
        if issubclass(hint, enum.IntEnum):
            enum_cls = hint

            def check_enum(value: Any, where: str) -> Any:
                if type(value) is not int:
                    _fail(where, enum_cls.__name__, value)
                try:
                    return enum_cls(value)
                except ValueError:
                    raise RemoteProtocolError(f"{where}: {value} is not a valid {enum_cls.__name__}") from None

            return check_enum
        if hint is PeerID:

            def check_peer(value: Any, where: str) -> Any:
                if type(value) is not bytes:
                    _fail(where, "PeerID bytes", value)
                try:
                    return PeerID(value)
                except ValueError:
                    raise RemoteProtocolError(f"{where}: not a valid PeerID") from None

            return check_peer
        if dataclasses.is_dataclass(hint):
            nested_cls = hint
            nested = _field_specs(nested_cls)

            def check_nested(value: Any, where: str) -> Any:
                if not isinstance(value, list):
                    _fail(where, f"{nested_cls.__name__} array", value)
                return _build(nested_cls, nested, value, where)

            return check_nested
    raise TypeError(f"unsupported message field annotation {hint!r}")


def _exact(kind: type) -> Checker:
    def check(value: Any, where: str) -> Any:
        if type(value) is not kind:
            _fail(where, kind.__name__, value)
        return value

    return check
