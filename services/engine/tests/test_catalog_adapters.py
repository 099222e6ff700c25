"""Adapters learnt from etcd's model catalog: ``CatalogAdapters`` declares new and changed adapter
entries on the engine's adapter registry (off the event loop), skips the ones the engine's flags
declared, forgets the ones the catalog drops and logs a refused one."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from llmfleet.coord.desired import ModelEntry
from llmfleet_engine.catalog_adapters import CatalogAdapters
from llmfleet_engine.lora import AdapterError
from llmfleet_engine.models import LoadedModel


@dataclass
class Registry:
    """An adapter registry recording its calls (and the thread that made them)."""

    calls: list[tuple[str, ...]] = field(default_factory=list)
    threads: set[int] = field(default_factory=set)
    refuse: set[str] = field(default_factory=set)

    def add(self, name: str, base: str, path: str | Path) -> object:
        self.threads.add(threading.get_ident())
        self.calls.append(("add", name, base, str(path)))
        if name in self.refuse:
            raise AdapterError(f"adapter {name!r}: refused")
        return None

    def remove(self, name: str) -> bool:
        self.calls.append(("remove", name))
        return True

    def base_of(self, name: str) -> str | None:
        return None

    def serving(self, bases: tuple[str, ...]) -> tuple[str, ...]:
        return bases

    def with_adapters(self, models: dict[str, LoadedModel]) -> dict[str, LoadedModel]:
        return models


def adapter(name: str, base: str, path: str) -> ModelEntry:
    return ModelEntry(name, "", base=base, adapter=path)


async def test_catalog_entries_are_declared_changed_and_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry(refuse={"bad"})
    forgotten: list[bool] = []
    follower = CatalogAdapters(reg, {"flagged": ("b", "/f")}, forgotten=lambda: forgotten.append(True))
    base = ModelEntry("b", "tiny://llama")
    await follower.sync(
        {"b": base, "flagged": adapter("flagged", "b", "/f"), "new": adapter("new", "b", "/n")}
    )
    assert reg.calls == [("add", "new", "b", "/n")]  # the flags' adapter is declared already
    assert threading.get_ident() not in reg.threads  # read off the event loop
    await follower.sync(
        {"b": base, "flagged": adapter("flagged", "b", "/f"), "new": adapter("new", "b", "/n")}
    )
    assert len(reg.calls) == 1  # nothing changed
    await follower.sync({"b": base, "new": adapter("new", "b", "/n2"), "bad": adapter("bad", "b", "/x")})
    assert reg.calls[1:] == [("add", "bad", "b", "/x"), ("add", "new", "b", "/n2")]
    assert "adapter 'bad': refused" in caplog.text
    assert forgotten == []
    await follower.sync({"b": base})
    assert sorted(reg.calls[3:]) == [("remove", "bad"), ("remove", "new")]  # the flags' one stays
    assert forgotten == [True]  # the node record is published again, once
