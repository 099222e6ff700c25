"""Which catalog architecture an emulated engine serves a model as, and the ``LoadedModel`` it reports.

A model maps to a cost-model catalog architecture (:data:`llmfleet.costmodel.MODEL_CATALOG`), in
order: the engine's ``sim_models`` (``--sim-model NAME=ARCH``; ``llmfleet up --emulate`` passes the
cluster config's ``sim_model`` entries), a source ``emulated://ARCH``, or the model's own name when it
is a catalog name. Nothing is read from disk: the weights' size, KV geometry and vocabulary are the
architecture's.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmfleet.costmodel import MODEL_CATALOG, ModelArch, UnknownModel, model_arch
from llmfleet.types import ModelSpec

from llmfleet_engine.emulated.tokenizer import EOS_ID, MAX_CONTEXT, word_tokenizer
from llmfleet_engine.models import DEFAULT_DTYPE, LoadedModel, ModelLoadError

SCHEME = "emulated://"


def resolve_arch(spec: ModelSpec, sim_models: Mapping[str, str]) -> ModelArch:
    """The catalog architecture ``spec`` is emulated as (``ModelLoadError`` naming the choices)."""
    name = sim_models.get(spec.name)
    if name is None and spec.source.startswith(SCHEME):
        name = spec.source[len(SCHEME) :].strip("/")
    if name is None:
        name = spec.name
    try:
        return model_arch(name)
    except UnknownModel:
        raise ModelLoadError(
            f"model {spec.name!r} (source {spec.source!r}) has no catalog architecture to emulate: "
            f"give it a sim_model (--sim-model {spec.name}=ARCH) or the source emulated://ARCH, "
            f"ARCH one of {sorted(MODEL_CATALOG)}"
        ) from None


def check_sim_models(sim_models: Mapping[str, str]) -> dict[str, ModelArch]:
    """Every ``NAME=ARCH`` mapping resolved (``ValueError`` naming an unknown architecture)."""
    out = {}
    for name, arch in sim_models.items():
        try:
            out[name] = model_arch(arch)
        except UnknownModel as e:
            raise ValueError(f"--sim-model {name}={arch}: {e.args[0]}") from None
    return out


def emulated_model(spec: ModelSpec, arch: ModelArch, device: str, tp: int) -> LoadedModel:
    """What the engine reports of ``spec`` served as ``arch`` on ``tp`` GPUs (no tensors)."""
    return LoadedModel(
        name=spec.name,
        source=spec.source,
        model=arch,
        tokenizer=word_tokenizer(arch.vocab_size),
        architecture=f"emulated:{arch.name}",
        dtype=spec.dtype or DEFAULT_DTYPE,  # as asked, so reconcile sees it served (sizes: arch.dtype)
        device=device,
        weight_bytes=arch.weight_bytes,
        max_context=MAX_CONTEXT,
        kv_bytes_per_token=arch.kv_bytes_per_token,
        eos_token_ids=frozenset({EOS_ID}),
        vocab_size=arch.vocab_size,
        path="",
        device_map=tuple(spec.device_map),
    )
