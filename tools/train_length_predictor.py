"""Train the learned output-length predictor and compare it with the empirical and service-mean ones.

    .venv/bin/python tools/train_length_predictor.py --data /work/shared/datasets/alpaca_4000.json \
        --out .llmfleet/predictor [--epochs 20] [--seed 0]

Splits the data 80/20 (seeded), trains/feeds each predictor on the 80 %, evaluates on the held-out 20 %,
prints a markdown table and saves the learned predictor to ``--out``. The learned predictor is timed
twice: cold (every prompt goes through MiniLM) and warm (embeddings cached: head only).
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
from llmfleet.predict.learned import LearnedLengthPredictor

SERVICE = "alpaca"


def fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    items = load_alpaca(args.data)
    train, test = train_test_split(items, 0.2, args.seed)
    print(
        f"{len(items)} items: {len(train)} train / {len(test)} test; lengths by MiniLM tokenizer",
        file=sys.stderr,
    )

    learned = LearnedLengthPredictor()
    learned.fit(
        [it.prompt for it in train], [it.output_tokens for it in train], epochs=args.epochs, seed=args.seed
    )
    learned.save(args.out)
    empirical = EmpiricalLengthPredictor(seed=args.seed)
    mean = ServiceMeanPredictor()
    for it in train:
        q = LengthQuery(SERVICE, it.prompt, it.prompt_tokens)
        empirical.observe(q, it.output_tokens)
        mean.observe(q, it.output_tokens)

    rows = []
    learned.clear_cache()
    rows.append(
        ("learned (cold: MiniLM + head)", evaluate(learned, test, service=SERVICE, clock=time.perf_counter))
    )
    rows.append(
        (
            "learned (warm: cached embeddings)",
            evaluate(learned, test, service=SERVICE, clock=time.perf_counter),
        )
    )
    rows.append(("empirical (Aladdin)", evaluate(empirical, test, service=SERVICE, clock=time.perf_counter)))
    rows.append(("service mean (SeaLLM)", evaluate(mean, test, service=SERVICE, clock=time.perf_counter)))
    base_mae = rows[-1][1]["mae"]

    print(
        "| predictor | acc@100 | acc@pow2 | MAE (tokens) | MAE / mean's | p50 ms (batch 32) | p99 ms (batch 32) |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, r in rows:
        print(
            f"| {label} | {r['acc_100']:.3f} | {r['acc_pow2']:.3f} | {r['mae']:.2f} | {r['mae'] / base_mae:.3f} "
            f"| {fmt(r['latency_p50_ms'])} | {fmt(r['latency_p99_ms'])} |"
        )
    r = rows[0][1]
    ok = r["acc_100"] >= 0.70 and r["mae"] <= 0.6 * base_mae
    print(
        f"\ngoal (acc@100 >= 0.70 and MAE <= 0.6 x mean's): {'met' if ok else 'NOT met'}; model saved to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
