"""A small, deterministic byte-level BPE tokenizer for the tiny test/demo models.

The tokenizer is trained with the ``tokenizers`` library on an embedded English corpus, so it needs
no download; being byte-level it encodes any Unicode text losslessly. It is wrapped as a
``transformers`` fast tokenizer and saved with ``save_pretrained``, so the engine loads it back with
``AutoTokenizer.from_pretrained`` exactly like a real checkpoint's tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"  # never produced by byte-level BPE; declared so tokenizer classes add no extra one
SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN)  # ids 0, 1, 2, 3
DEFAULT_VOCAB_SIZE = 512
MODEL_MAX_LENGTH = 2048

CORPUS = """\
The quick brown fox jumps over the lazy dog. A small cluster of machines can serve many language
models at once, if the scheduler is careful about memory and time. Every request arrives with a
prompt, and the engine answers with a stream of tokens, one after another, until it reaches the end.

Once upon a time there was a little town by the river. The people of the town were farmers and
fishermen, and in the morning they would walk to the market to sell bread, apples, cheese and fish.
The children played in the streets, and the old men sat in the shade of the trees and talked about
the weather. When the rain came in the autumn, the river rose and the water covered the fields.

Computers store numbers, letters and pictures as bits. A byte is eight bits, and text is usually
encoded as UTF-8, where common letters take one byte and other characters take two, three or four.
A tokenizer splits text into pieces called tokens; a model reads the tokens and predicts the next one.
Training a model means adjusting its weights so that its predictions become more accurate over time.

The weather today is sunny with a light breeze from the west. Tomorrow there will be clouds in the
morning and rain in the afternoon. Temperatures will stay between ten and eighteen degrees. In the
evening the wind will turn to the north, and the night will be cold and clear.

She opened the door and looked outside. The garden was quiet, and the flowers were still wet from
the night. He asked her whether she wanted some tea, and she said yes, thank you, with a little milk.
They sat together at the kitchen table and read the letters that had arrived the day before.

How does a service keep its promise to answer quickly? It measures the time to the first token and
the time between tokens, and it adds more workers when the queue grows. When the load falls again,
it releases the workers it no longer needs, so that other services can use the same hardware.

Question: What is the capital of France? Answer: The capital of France is Paris.
Question: How many days are there in a week? Answer: There are seven days in a week.
Question: What color is the sky on a clear day? Answer: The sky is blue on a clear day.
Question: Which animal is known as the king of the jungle? Answer: The lion is called the king.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i))

Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 256 512 1024 2048 3.14 2.71 1,000 42.
Dates and times: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday; January, February,
March, April, May, June, July, August, September, October, November, December; 09:30, 12:00, 18:45.

Good morning! How are you today? I am fine, thanks. Could you please tell me the way to the station?
Go straight ahead, then turn left at the second street, and the station will be on your right.
Thank you very much. You are welcome. Have a nice day, and see you again soon.

History teaches us that great changes often begin with small steps. A single idea, shared between
friends, can grow into a movement that changes the world. Science, art and music have always moved
forward when people were free to ask questions, to make mistakes, and to try again.
"""


def _corpus_lines(corpus: str) -> list[str]:
    return [line for line in corpus.splitlines() if line.strip()]


def train_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, corpus: str = CORPUS) -> Tokenizer:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on ``corpus`` (deterministic for equal inputs).

    The vocabulary holds the special tokens (ids 0..3), the 256-symbol byte alphabet and merges up to
    ``vocab_size`` (fewer when the corpus has no more pairs seen at least twice). Encoding adds ``<s>``.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must be >= {len(SPECIAL_TOKENS) + 256}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(corpus), trainer=trainer)
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    return tok


@lru_cache(maxsize=4)
def _trained_json(vocab_size: int) -> str:
    return train_tokenizer(vocab_size).to_str()


def build_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """The trained tokenizer wrapped as a ``transformers`` fast tokenizer with bos/eos/pad set."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_json(vocab_size)),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def tokenizer_fingerprint(vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
    """A short hash identifying the trained tokenizer (changes when the corpus or settings change)."""
    return hashlib.sha256(_trained_json(vocab_size).encode()).hexdigest()[:16]


def save_tokenizer(directory: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Build the tokenizer and ``save_pretrained`` it into ``directory``; returns the tokenizer."""
    tokenizer = build_tokenizer(vocab_size)
    tokenizer.save_pretrained(str(directory))
    _normalize_json_files(Path(directory))
    return tokenizer


def _normalize_json_files(directory: Path) -> None:
    """Rewrite the saved tokenizer JSON files with sorted keys so repeated builds are byte-identical."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        if path.exists():
            data = json.loads(path.read_text())
            path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
