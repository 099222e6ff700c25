"""Hypothesis strategies for protobuf messages, built from their descriptors (no official
``hypothesis.extra`` for protobuf exists).

``messages(Cls)`` draws instances of ``Cls`` whose fields take valid, boundary and invalid values:
integers at 0, ±1 and the type's limits, floats including NaN, ±inf, -0.0 and huge values, strings
empty / unicode / control characters / oversized (``OVERSIZED`` characters), bytes likewise, enums
both defined and unknown numbers, repeated fields empty, short or long, oneofs with one or no member
set, nested messages to ``max_depth``. ``overrides`` maps a dotted field path (``"sampling.max_tokens"``,
``"header.prompt"``) to a strategy for that field's value (a list for repeated fields), to keep a
fuzzed call bounded where the server does real work per unit (tokens to generate, bytes to send), or
to a function of the field's fuzz strategy (``lambda fuzz: st.one_of(st.just("chat"), fuzz)``) to
mix valid values in, so that more calls get past the first check into deeper code.

A drawn message is kept under ``max_bytes`` serialized (default 3 MiB, below gRPC's 4 MiB receive
limit); bigger draws are rejected, so oversized values stay rare enough not to trip the health check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

OVERSIZED = 1 << 20  # 1 Mi characters / bytes
MAX_MESSAGE_BYTES = 3 << 20
LONG_REPEATED = 1000  # scalars; repeated messages stay at most SHORT_REPEATED * 4

_T = FieldDescriptor
Override = st.SearchStrategy | Callable[[st.SearchStrategy], st.SearchStrategy]
_INT_RANGES = {
    _T.TYPE_INT32: (-(2**31), 2**31 - 1),
    _T.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _T.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _T.TYPE_UINT32: (0, 2**32 - 1),
    _T.TYPE_FIXED32: (0, 2**32 - 1),
    _T.TYPE_INT64: (-(2**63), 2**63 - 1),
    _T.TYPE_SINT64: (-(2**63), 2**63 - 1),
    _T.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    _T.TYPE_UINT64: (0, 2**64 - 1),
    _T.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOAT_BOUNDARY = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, float("nan"), float("inf"), float("-inf")]
_STRING_BOUNDARY = [
    "",
    " ",
    "\x00",
    "a" * 129,
    "é中文🙂",
    "\u202e\ufeff",
    "../../etc/passwd",
    "%s%n{}",
    "\ud7ff",
]
_OVERSIZED_STR = "x" * OVERSIZED
_OVERSIZED_BYTES = b"\x00" * OVERSIZED


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    boundary = sorted(
        {v for v in (0, 1, -1, 2, lo, lo + 1, hi, hi - 1, 2**31 - 1, 2**32 - 1) if lo <= v <= hi}
    )
    return st.one_of(st.sampled_from(boundary), st.integers(lo, hi), st.integers(0, 300))


def _rarely(rare: st.SearchStrategy, usual: st.SearchStrategy, one_in: int = 24) -> st.SearchStrategy:
    """``rare`` about once in ``one_in`` draws, else ``usual`` (one_of would pick each half the time)."""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == one_in - 1 else usual)


def _scalar(f: FieldDescriptor, oversized: bool) -> st.SearchStrategy:
    t = f.type
    if t in _INT_RANGES:
        return _int(*_INT_RANGES[t])
    if t == _T.TYPE_BOOL:
        return st.booleans()
    if t == _T.TYPE_FLOAT:
        return st.one_of(
            st.sampled_from([*_FLOAT_BOUNDARY, 3.4e38, -3.4e38]),
            st.floats(width=32),
            st.floats(0, 2, width=32),
        )
    if t == _T.TYPE_DOUBLE:
        return st.one_of(st.sampled_from([*_FLOAT_BOUNDARY, 1e308, -1e308]), st.floats(), st.floats(0, 100))
    if t == _T.TYPE_STRING:
        normal = st.one_of(st.sampled_from(_STRING_BOUNDARY), st.text(max_size=40))
        return _rarely(st.just(_OVERSIZED_STR), normal) if oversized else normal
    if t == _T.TYPE_BYTES:
        normal = st.one_of(st.sampled_from([b"", b"\x00", b"\xff" * 7]), st.binary(max_size=64))
        return _rarely(st.just(_OVERSIZED_BYTES), normal) if oversized else normal
    if t == _T.TYPE_ENUM:
        defined = [v.number for v in f.enum_type.values]
        unknown = [max(defined) + 1, 99, -1, 2**31 - 1, -(2**31)]
        return st.one_of(st.sampled_from(defined), st.sampled_from(unknown))
    raise TypeError(f"{f.full_name}: unsupported field type {t}")


def _is_repeated(f: FieldDescriptor) -> bool:
    return f.is_repeated


def _value(f: FieldDescriptor, path: str, depth: int, ctx: _Ctx) -> st.SearchStrategy:
    override = ctx.overrides.get(path)
    if isinstance(override, st.SearchStrategy):
        return override
    if override is not None:  # a function of the field's own fuzz strategy, e.g. to mix in valid values
        return override(_fuzz_value(f, path, depth, ctx))
    return _fuzz_value(f, path, depth, ctx)


def _fuzz_value(f: FieldDescriptor, path: str, depth: int, ctx: _Ctx) -> st.SearchStrategy:
    if f.type == _T.TYPE_MESSAGE:
        if f.message_type.GetOptions().map_entry:
            key, val = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            return st.dictionaries(_value(key, path, depth, ctx), _value(val, path, depth, ctx), max_size=3)
        elem = _message_dict(f.message_type, f"{path}.", depth + 1, ctx)
        return st.lists(elem, max_size=8) if _is_repeated(f) else elem
    elem = _scalar(f, ctx.oversized)
    if _is_repeated(f):
        small = _scalar(f, oversized=False)
        return _rarely(
            st.lists(small, min_size=LONG_REPEATED, max_size=LONG_REPEATED), st.lists(small, max_size=6), 8
        )
    return elem


class _Ctx:
    def __init__(self, overrides: Mapping[str, Override], max_depth: int, oversized: bool) -> None:
        self.overrides = dict(overrides)
        self.max_depth = max_depth
        self.oversized = oversized


def _steered(f: FieldDescriptor, prefix: str, ctx: _Ctx) -> bool:
    path = f"{prefix}{f.name}"
    return any(p == path or p.startswith(f"{path}.") for p in ctx.overrides)


def _message_dict(d: Descriptor, prefix: str, depth: int, ctx: _Ctx) -> st.SearchStrategy[dict]:
    """A dict of field name -> value for ``d`` (only the fields that are set)."""
    if depth > ctx.max_depth:
        return st.just({})
    plain = [f for f in d.fields if f.containing_oneof is None or f.containing_oneof.name.startswith("_")]
    fields = {
        # unset half the time; a field with an override (steered values) a quarter of the time
        f.name: _rarely(
            st.none(), _value(f, f"{prefix}{f.name}", depth, ctx), 4 if _steered(f, prefix, ctx) else 2
        )
        for f in plain
    }
    oneofs = [o for o in d.oneofs if not o.name.startswith("_")]  # "_x": a proto3 `optional`

    @st.composite
    def build(draw) -> dict:
        out = {k: v for k, v in ((k, draw(s)) for k, s in fields.items()) if v is not None}
        for o in oneofs:
            member = draw(st.sampled_from([None, *o.fields]))
            if member is not None:
                out[member.name] = draw(_value(member, f"{prefix}{member.name}", depth, ctx))
        return out

    return build()


def _fill(msg: Message, values: Mapping) -> Message:
    for name, v in values.items():
        f = msg.DESCRIPTOR.fields_by_name[name]
        if f.type == _T.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            getattr(msg, name).update(v)
        elif f.type == _T.TYPE_MESSAGE and _is_repeated(f):
            for item in v:
                _fill(getattr(msg, name).add(), item)
        elif isinstance(v, Message):  # an override's ready-made message
            getattr(msg, name).CopyFrom(v)
        elif f.type == _T.TYPE_MESSAGE:
            getattr(msg, name).SetInParent()
            _fill(getattr(msg, name), v)
        elif _is_repeated(f):
            getattr(msg, name).extend(v)
        else:
            setattr(msg, name, v)
    return msg


def messages(
    cls: type[Message],
    overrides: Mapping[str, Override] | None = None,
    *,
    max_depth: int = 4,
    oversized: bool = True,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> st.SearchStrategy[Message]:
    """Instances of the protobuf message class ``cls`` with fuzzed field values (see the module doc)."""
    ctx = _Ctx(overrides or {}, max_depth, oversized)
    return (
        _message_dict(cls.DESCRIPTOR, "", 0, ctx)
        .map(lambda values: _fill(cls(), values))
        .filter(lambda m: m.ByteSize() <= max_bytes)
    )
