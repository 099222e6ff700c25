"""Train the learned output-length predictor and compare it with the empirical and service-mean ones.

    .venv/bin/python -m tools.train_length_predictor --data ../shared/datasets/alpaca_4000.json \
        --out .llmfleet/predictor [--finetune-epochs 3] [--head-epochs 20] [--seed 0]

Splits the data 80/20 (seeded), trains/feeds each predictor on the 80 %, evaluates on the held-out 20 %,
prints a markdown table and saves the learned predictor (both encoders; ``static`` is the default) to
``--out``. Training fine-tunes MiniLM (≈ 5–10 min on two CPU cores for 3 epochs over 3,200 prompts),
then distils it into the static encoder (≈ 1 min). Each learned encoder is timed cold (new prompts:
the encoder runs) and warm (features cached: head only). The point estimate scored is the predictive
median where a predictor reports quantiles, else its mean (``llmfleet.predict.evaluate``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from llmfleet.predict import EmpiricalLengthPredictor, LengthQuery, ServiceMeanPredictor
from llmfleet.predict.dataset import load_alpaca, train_test_split
from llmfleet.predict.evaluate import evaluate
from llmfleet.predict.learned import ENCODERS, LearnedLengthPredictor

SERVICE = "alpaca"


def fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--finetune-epochs", type=int, default=3, help="0: frozen MiniLM + MLP head")
    ap.add_argument("--head-epochs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="seeds the split and the training")
    ap.add_argument("--default-encoder", choices=ENCODERS, default="static", help="saved as the default")
    args = ap.parse_args(argv)

    items = load_alpaca(args.data)
    train, test = train_test_split(items, 0.2, args.seed)
    print(
        f"{len(items)} items: {len(train)} train / {len(test)} test; lengths by MiniLM tokenizer",
        file=sys.stderr,
    )

    learned = LearnedLengthPredictor()
    t0 = time.perf_counter()
    learned.fit(
        [it.prompt for it in train],
        [it.output_tokens for it in train],
        finetune_epochs=args.finetune_epochs,
        head_epochs=args.head_epochs,
        seed=args.seed,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(f"trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    learned.use(args.default_encoder).save(args.out)
    empirical = EmpiricalLengthPredictor(seed=args.seed)
    mean = ServiceMeanPredictor()
    for it in train:
        q = LengthQuery(SERVICE, it.prompt, it.prompt_tokens)
        empirical.observe(q, it.output_tokens)
        mean.observe(q, it.output_tokens)

    rows = []
    for kind in ("static", "minilm"):
        learned.use(kind).clear_cache()
        for state in ("cold", "warm"):
            r = evaluate(learned, test, service=SERVICE, clock=time.perf_counter)
            rows.append((f"learned {kind} ({state})", r))
    rows.append(("empirical (Aladdin)", evaluate(empirical, test, service=SERVICE, clock=time.perf_counter)))
    rows.append(("service mean (SeaLLM)", evaluate(mean, test, service=SERVICE, clock=time.perf_counter)))
    base_mae = rows[-1][1]["mae"]

    print(
        "| predictor | point | acc@100 | acc@pow2 | MAE (tokens) | MAE / mean's | MAE of mean "
        "| p50 ms (batch 32) | p99 ms (batch 32) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        print(
            f"| {label} | {r['point']} | {r['acc_100']:.3f} | {r['acc_pow2']:.3f} | {r['mae']:.2f} "
            f"| {r['mae'] / base_mae:.3f} | {r['mae_mean']:.2f} "
            f"| {fmt(r['latency_p50_ms'])} | {fmt(r['latency_p99_ms'])} |"
        )
    for label, r in rows[:4:2]:
        ok = r["acc_100"] >= 0.70 and r["mae"] <= 0.6 * base_mae
        print(f"goal (acc@100 >= 0.70 and MAE <= 0.6 x mean's), {label}: {'met' if ok else 'NOT met'}")
    print(f"model saved to {args.out} (default encoder: {args.default_encoder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
