"""etcd key layout (ARCHITECTURE.md, "Coordination"); every key lives under a configurable prefix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "/llmfleet"

    def _k(self, *parts: str) -> str:
        return "/".join((self.prefix.rstrip("/"), *parts))

    @property
    def nodes(self) -> str:
        return self._k("nodes", "")

    def node(self, node_id: str) -> str:
        return self._k("nodes", node_id)

    @property
    def services(self) -> str:
        return self._k("services", "")

    def service(self, name: str) -> str:
        return self._k("services", name)

    @property
    def models(self) -> str:
        """``models/``: runtime model declarations (source, dtype, sim_model) the services refer to."""
        return self._k("models", "")

    def model(self, name: str) -> str:
        return self._k("models", name)

    @property
    def services_seeded(self) -> str:
        """``services_seeded``: written (with the seeded ``services/`` and ``models/``) in the one
        transaction in which the placement leader seeds them from the cluster file; while it exists
        the leader never writes ``services/`` again (outside the ``services/`` prefix on purpose)."""
        return self._k("services_seeded")

    @property
    def placements(self) -> str:
        return self._k("placement", "")

    def placement(self, engine_id: str) -> str:
        return self._k("placement", engine_id)

    @property
    def profiles(self) -> str:
        return self._k("profiles", "")

    def profile(self, model: str, hardware: str) -> str:
        return self._k("profiles", model, hardware)

    @property
    def leaders(self) -> str:
        return self._k("leaders", "")

    def leader(self, role: str) -> str:
        return self._k("leaders", role)

    @property
    def limit_demands(self) -> str:
        """``limit_demands/``: each scheduler replica's demand per rate-limited API key, under its lease
        (llmfleet.security.limit_shares: the replicas split a key's limits by it)."""
        return self._k("limit_demands", "")

    def limit_demand(self, replica: str) -> str:
        return self._k("limit_demands", replica)

    @staticmethod
    def leaf(key: str) -> str:
        """Last path component (the id) of a key."""
        return key.rstrip("/").rsplit("/", 1)[-1]
