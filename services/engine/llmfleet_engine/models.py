"""Model sources and loading: local checkpoints, hub ids and ``tiny://<arch>`` random models.

``materialize`` turns a source into something ``from_pretrained`` accepts; for ``tiny://`` it builds a
small random model from a config (fixed seed) plus the embedded BPE tokenizer and saves both as a
regular checkpoint directory. ``load_model`` then always goes through ``AutoModelForCausalLM`` and
``AutoTokenizer.from_pretrained``, the same path as a real checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from llmfleet.types import ModelSpec
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from llmfleet_engine import tokenizer as tiny_tokenizer

log = logging.getLogger(__name__)

TINY_SCHEME = "tiny://"
TINY_SEED = 1234
DEFAULT_CACHE_DIR = Path(os.environ.get("LLMFLEET_MODEL_CACHE", ".llmfleet/models"))
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DEFAULT_DTYPE = "float32"

_COMMON: dict[str, Any] = {
    "max_position_embeddings": 2048,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "initializer_range": 0.2,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}

# Small configs in the Llama family; vocab and special-token ids come from the tiny tokenizer.
TINY_ARCHS: dict[str, dict[str, Any]] = {
    "llama": {
        **_COMMON,
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        **_COMMON,
        "model_type": "qwen2",
        "hidden_size": 96,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
    },
    "mistral": {
        **_COMMON,
        "model_type": "mistral",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
    },
}


class ModelLoadError(Exception):
    """A model source could not be loaded (maps to INVALID_ARGUMENT)."""


class ModelSourceNotFound(ModelLoadError):
    """The source names nothing that exists: a missing directory, unknown tiny arch or hub id."""


@dataclass
class LoadedModel:
    """A model ready for inference plus the facts the engine reports about it."""

    name: str
    source: str
    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    architecture: str
    dtype: str
    device: str
    weight_bytes: int
    max_context: int
    kv_bytes_per_token: int
    eos_token_ids: frozenset[int]
    vocab_size: int
    path: str = ""
    load_s: float = 0.0
    device_map: tuple[tuple[str, str], ...] = ()  # as loaded; () = all on ``device``

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(name=self.name, source=self.source, dtype=self.dtype, device_map=self.device_map)

    def serves(self, spec: ModelSpec) -> bool:
        """Whether this is what ``spec`` asks for: the same source, dtype and device map."""
        return (spec.source, spec.dtype or DEFAULT_DTYPE, tuple(spec.device_map)) == (
            self.source,
            self.dtype,
            self.device_map,
        )


def tiny_config(arch: str) -> PretrainedConfig:
    """The config of ``tiny://<arch>`` (vocab and bos/eos/pad ids taken from the tiny tokenizer)."""
    if arch not in TINY_ARCHS:
        raise ModelSourceNotFound(f"unknown tiny architecture {arch!r}; known: {sorted(TINY_ARCHS)}")
    tok = tiny_tokenizer.build_tokenizer()
    params = dict(TINY_ARCHS[arch])
    model_type = params.pop("model_type")
    return AutoConfig.for_model(
        model_type,
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **params,
    )


def _tiny_dir_name(arch: str, config: PretrainedConfig) -> str:
    payload = json.dumps(
        {
            "config": config.to_diff_dict(),
            "seed": TINY_SEED,
            "tokenizer": tiny_tokenizer.tokenizer_fingerprint(),
        },
        sort_keys=True,
    )
    return f"{arch}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


def _build_tiny(arch: str, config: PretrainedConfig, target: Path) -> None:
    """Write a random-initialised checkpoint for ``arch`` to ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_SEED)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.generation_config.bos_token_id = config.bos_token_id
        model.generation_config.eos_token_id = config.eos_token_id
        model.generation_config.pad_token_id = config.pad_token_id
        model.save_pretrained(str(tmp))
        tiny_tokenizer.save_tokenizer(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner is complete
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def materialize(source: str, cache_dir: str | Path | None = None) -> str:
    """Resolve ``source`` to a ``from_pretrained`` argument: a local directory or a hub id.

    ``tiny://<arch>`` is built once into ``cache_dir/<arch>-<config hash>`` and reused afterwards.
    Raises ``ModelSourceNotFound`` for a missing local path or unknown tiny arch.
    """
    source = source.strip()
    if not source:
        raise ModelLoadError("model source is empty")
    if source.startswith(TINY_SCHEME):
        arch = source[len(TINY_SCHEME) :].strip("/")
        config = tiny_config(arch)
        target = Path(cache_dir or DEFAULT_CACHE_DIR) / _tiny_dir_name(arch, config)
        if not (target / "config.json").exists():
            log.info("building tiny model %s into %s", source, target)
            _build_tiny(arch, config, target)
        return str(target)
    path = Path(source.removeprefix("file://")).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model source {source!r} is a file, expected a checkpoint directory")
        return str(path)
    if source.startswith(("/", "./", "../", "~", "file://")) or source.count("/") > 1:  # hub ids: org/name
        raise ModelSourceNotFound(f"model directory {source!r} does not exist")
    return source  # a hub id


def eos_ids(gen: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end generation, by ``generate``'s rule: the generation config's ``eos_token_id``
    (which transformers initialises from the model config); the tokenizer's only when the model
    has no generation config at all. A checkpoint that sets it to null never stops on EOS. Both
    backends end requests by this rule."""
    value = gen.eos_token_id if gen is not None else getattr(tokenizer, "eos_token_id", None)
    if isinstance(value, int):
        return frozenset({value})
    if isinstance(value, list | tuple):
        return frozenset(v for v in value if isinstance(v, int))
    return frozenset()


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V cache one token occupies: 2 * layers * kv_heads * head_dim * dtype bytes."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * itemsize


def check_device_map(model: torch.nn.Module, device_map: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``device_map`` as a dict after checking it against ``model``'s modules (a meta-device copy will
    do): every parameter and buffer under exactly one named module, tied parameters on one device,
    real devices only (cpu, cuda; no "meta"/"disk"), CUDA devices present. Raises ``ModelLoadError``
    naming the offending modules."""
    out: dict[str, str] = {}
    dupes = sorted({m for m, _ in device_map if sum(1 for k, _ in device_map if k == m) > 1})
    if dupes:
        raise ModelLoadError(f"device_map names modules more than once: {dupes}")
    devices: dict[str, torch.device] = {}
    for module, dev in device_map:
        try:
            devices[dev] = torch.device(dev)
        except (RuntimeError, TypeError) as e:
            raise ModelLoadError(f"device_map: bad device {dev!r} for {module!r}: {e}") from e
        if devices[dev].type not in ("cpu", "cuda"):
            raise ModelLoadError(f"device_map: {module!r} on {dev!r}; only real cpu/cuda devices are allowed")
        out[module] = dev
    modules = dict(model.named_modules())
    unknown = [m for m in out if m not in modules]
    if unknown:
        raise ModelLoadError(f"device_map names unknown modules {unknown} of {type(model).__name__}")
    tensors = list(model.named_parameters(remove_duplicate=False))
    tensors += list(model.named_buffers(remove_duplicate=False))
    missing: dict[str, None] = {}
    nested: set[str] = set()
    placed: dict[int, dict[str, str]] = {}  # tensor id -> {name: device}: tied tensors share an id
    for name, tensor in tensors:
        owners = [k for k in out if k == "" or name == k or name.startswith(k + ".")]
        if not owners:
            missing[name.rpartition(".")[0]] = None
        elif len(owners) > 1:
            nested.update(owners)
        else:
            placed.setdefault(id(tensor), {})[name] = out[owners[0]]
    if missing:
        raise ModelLoadError(f"device_map leaves modules without a device: {list(missing)}")
    if nested:
        raise ModelLoadError(f"device_map covers modules more than once (nested keys): {sorted(nested)}")
    for names in placed.values():
        if len(set(names.values())) > 1:
            raise ModelLoadError(f"device_map splits tied parameters across devices: {names}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for dev, parsed in devices.items():
        if parsed.type == "cuda" and (parsed.index or 0) >= count:
            raise ModelLoadError(f"device_map uses {dev!r}, but this host has {count} CUDA devices")
    return out


def _checked_device_map(path: str, spec: ModelSpec, local_only: bool) -> dict[str, str]:
    """Check ``spec.device_map`` against the architecture of ``path``, built on the meta device."""
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=local_only)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except OSError as e:
        raise ModelSourceNotFound(f"cannot read the config of {spec.source!r}: {e}") from e
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ModelLoadError(f"cannot build model {spec.source!r} to check its device_map: {e}") from e
    return check_device_map(skeleton, spec.device_map)


def load_model(
    spec: ModelSpec,
    device: str = "cpu",
    cache_dir: str | Path | None = None,
    allow_download: bool = True,
) -> LoadedModel:
    """Load ``spec`` through ``from_pretrained`` onto ``device`` in eval mode.

    A non-empty ``spec.device_map`` (e.g. a HELR plan) replaces ``device``: it is checked against the
    architecture (:func:`check_device_map`), passed to ``from_pretrained`` (accelerate dispatches the
    modules and moves hidden states between devices) and the model reports its first device.
    With ``allow_download=False`` a hub id is only looked up in the local Hugging Face cache.

    Raises ``ModelSourceNotFound`` when the source does not exist and ``ModelLoadError`` when it exists
    but cannot be loaded (bad dtype, not a causal LM checkpoint, ...).
    """
    if not spec.name.strip():
        raise ModelLoadError("model name is empty")
    dtype_name = spec.dtype or DEFAULT_DTYPE
    if dtype_name not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype_name!r}; supported: {sorted(DTYPES)}")
    dtype = DTYPES[dtype_name]
    started = time.perf_counter()
    path = materialize(spec.source, cache_dir)
    is_local = Path(path).is_dir()
    local_only = is_local or not allow_download
    device_map = _checked_device_map(path, spec, local_only) if spec.device_map else None
    placement: dict[str, Any] = {"device_map": device_map} if device_map else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=local_only, **placement
        )
    except OSError as e:  # missing files / not on the hub / offline
        kind = "checkpoint" if is_local else "hub model"
        raise ModelSourceNotFound(f"cannot load {kind} {spec.source!r}: {e}") from e
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load model {spec.source!r}: {e}") from e
    if device_map:
        device = spec.device_map[0][1]
    else:
        try:
            model.to(device)
        except (RuntimeError, AssertionError) as e:
            raise ModelLoadError(f"cannot place model {spec.source!r} on device {device!r}: {e}") from e
    model.eval()
    config = model.config
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedModel(
        name=spec.name,
        source=spec.source,
        model=model,
        tokenizer=tokenizer,
        architecture=(config.architectures or [type(model).__name__])[0],
        dtype=dtype_name,
        device=str(device),
        weight_bytes=weight_bytes,
        max_context=int(getattr(config, "max_position_embeddings", 0) or tokenizer.model_max_length),
        kv_bytes_per_token=kv_bytes_per_token(config, dtype),
        eos_token_ids=eos_ids(getattr(model, "generation_config", None), tokenizer),
        vocab_size=int(config.vocab_size),
        path=path,
        load_s=time.perf_counter() - started,
        device_map=spec.device_map,
    )


def without_eos(checkpoint: str | Path, dest: str | Path) -> Path:
    """A copy of a checkpoint dir whose configs set ``eos_token_id`` to null, so generation always runs
    to ``max_tokens`` (for benchmarks and long-running tests). Atomic and reused when present."""
    src, dst = Path(checkpoint), Path(dest)
    if dst.exists():
        return dst
    tmp = dst.with_name(f".{dst.name}-{os.getpid()}-{time.monotonic_ns()}")
    shutil.copytree(src, tmp)
    for name in ("config.json", "generation_config.json"):
        p = tmp / name
        if p.exists():
            data = json.loads(p.read_text())
            data["eos_token_id"] = None
            p.write_text(json.dumps(data, indent=2))
    try:
        tmp.rename(dst)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return dst
