"""Errors of the KV block allocator (all subclasses of :class:`KvBlocksError`)."""

from __future__ import annotations


class KvBlocksError(Exception):
    """Base of every error the KV block allocator raises."""


class OutOfBlocks(KvBlocksError):
    """Not enough free blocks: ``needed`` blocks were asked for, ``free`` were available."""

    def __init__(self, needed: int, free: int, message: str | None = None) -> None:
        self.needed = needed
        self.free = free
        self.message = message or f"need {needed} KV blocks but only {free} are free"
        super().__init__(self.message)

    def __reduce__(self):  # keep it picklable (the simulator may run in worker processes)
        return (type(self), (self.needed, self.free, self.message))


class _LookupMessage(KvBlocksError, KeyError):
    """A KeyError whose str() is the plain message (KeyError would print its repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownModel(_LookupMessage):
    """The model is not registered with this pool."""


class UnknownSequence(_LookupMessage):
    """The sequence id is not live in this pool."""


class DuplicateSequence(KvBlocksError, ValueError):
    """The sequence id is already live."""


class ShapeMismatch(KvBlocksError, ValueError):
    """A model name is used with a KV shape other than the registered one."""


class ModelInUse(KvBlocksError, RuntimeError):
    """The model still has live sequences."""
