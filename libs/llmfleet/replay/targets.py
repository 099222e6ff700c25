"""Which live services a replay sends to, in which order (the order ``assign_services`` maps length
clusters onto), with which SLOs, and each model's cost-model catalog name (for solo times and plans).

- ``--services FILE`` (a services YAML, as ``llmfleet sim`` reads it): its services, order and SLOs;
- ``--cluster-config FILE``: its services sorted by name with their SLOs (``llmfleet sim``'s order);
- ``--services a,b``: those live services in that order, SLOs from etcd's ``services/``;
- neither: every live service, sorted by name.

Every target must be a live service (:class:`UnknownService` names the flag otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmfleet.costmodel import UnknownModel, model_arch
from llmfleet.sim.spec import SimService
from llmfleet.spec.services import ServiceSpec

if TYPE_CHECKING:
    from llmfleet.config import ClusterConfig


class UnknownService(ValueError):
    """A target the live cluster does not serve; ``flag`` is the option that named it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


def catalog_name(model: str, sim_model: str | None = None) -> str | None:
    """The cost-model catalog name of a live model: its ``sim_model``, else its own name if that is
    one; None when neither is."""
    for name in (sim_model, model):
        if name:
            try:
                return model_arch(name).name
            except UnknownModel:
                continue
    return None


def model_names(live: Mapping[str, ServiceSpec], sim_models: Mapping[str, str | None]) -> dict[str, str]:
    """live model name -> catalog name, for every model with one (``sim_models``: models/ entries)."""
    out = {}
    for m in {s.model for s in live.values()} | set(sim_models):
        name = catalog_name(m, sim_models.get(m))
        if name is not None:
            out[m] = name
    return out


def live_targets(
    names: Sequence[str] | None, live: Mapping[str, ServiceSpec], catalog: Mapping[str, str]
) -> list[SimService]:
    """``names`` (None: every live service, sorted) as services with the live SLOs; the model is the
    catalog name when there is one, else the live model's name."""
    chosen = list(names) if names else sorted(live)
    check_known(chosen, live, "--services")
    return [SimService(n, catalog.get(live[n].model, live[n].model), live[n].slo) for n in chosen]


def check_known(names: Sequence[str], live: Mapping[str, ServiceSpec], flag: str) -> None:
    unknown = [n for n in names if n not in live]
    if unknown:
        have = ", ".join(sorted(live)) or "none"
        raise UnknownService(flag, f"unknown service(s) {', '.join(unknown)}; the cluster serves: {have}")
    if len(set(names)) != len(names):
        raise UnknownService(flag, f"a service is named twice: {', '.join(names)}")


def config_targets(config: ClusterConfig, live: Mapping[str, ServiceSpec]) -> list[SimService]:
    """A cluster config's services sorted by name (``llmfleet sim --cluster-config``'s order) with its
    SLOs; models as catalog names where they have one."""
    check_known(sorted(config.services), live, "--cluster-config")
    out = []
    for name, svc in sorted(config.services.items()):
        m = config.models.get(svc.model)
        model = catalog_name(svc.model, m.sim_model if m is not None else None) or svc.model
        out.append(SimService(name, model, svc.slo))
    return out


def file_targets(services: Sequence[SimService], live: Mapping[str, ServiceSpec]) -> list[SimService]:
    """A services YAML's services (``llmfleet sim --services``), in its order, with its SLOs."""
    check_known([s.name for s in services], live, "--services")
    return list(services)
