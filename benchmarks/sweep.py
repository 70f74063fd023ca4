"""Head-ablation sweeps three ways, in one process, on the same prompts:

1. the naive loop (the released code's, and the usual TransformerLens / nnsight pattern): for
   every ablation, a forward pass of every (prompt, candidate) sequence with full logits;
2. the exact engine (`helpers.engine.SweepEngine`);
3. the screen: attribution patching over all heads (at each layer's midpoint, and plain), then
   the engine on its top k.

It prints throughput ratios measured side by side (absolute seconds on a shared machine mean
little), checks that the engine's log-likelihoods equal the naive loop's, and reports how well the
screen's ranking matches the exact one. With CUDA present it also times the engine on a
random-weight model of Llama-3.1-8B's shape (bf16).

    python benchmarks/sweep.py            # SmolLM2-135M on CPU, 40 KV prompts of 8 keys
    python benchmarks/sweep.py --quick    # fewer prompts and heads, for a smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import numpy as np
import pandas as pd
import torch

import helpers
from helpers import screen
from helpers.engine import SweepEngine
from helpers.packing import encode_pair
from helpers.paths import results_dir


@torch.inference_mode()
def naive_loglikelihoods(forward, tokenizer, items, batch_size: int = 32) -> np.ndarray:
    """One right-padded forward pass per batch of full sequences (`forward(ids) -> logits`),
    log-softmax over the whole vocabulary at every position, then the continuation's tokens
    gathered (the release's way)."""
    seqs = [encode_pair(tokenizer, c, x, it.verbatim) for it in items for c, x in it.pairs]
    out = np.zeros(len(seqs))
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start:start + batch_size]
        T = max(len(c) + len(t) for c, t in chunk)
        ids = torch.full((len(chunk), T), tokenizer.pad_token_id)
        for i, (c, t) in enumerate(chunk):
            ids[i, : len(c) + len(t)] = torch.tensor(c + t)
        logp = torch.log_softmax(forward(ids).float(), dim=-1)
        for i, (c, t) in enumerate(chunk):
            steps = torch.arange(len(c) - 1, len(c) + len(t) - 1)
            out[start + i] = logp[i, steps, torch.tensor(t)].sum().item()
    return out


def nnsight_naive(loaded, items, layer: int, head: int) -> np.ndarray:
    """The naive loop through nnsight: the head's slice of o_proj's input set to zero in a trace."""
    from nnsight import LanguageModel

    lm = LanguageModel(loaded.model, tokenizer=loaded.tokenizer)
    dim = loaded.adapter.head_dim(layer)

    def forward(ids):
        with lm.trace(ids):
            lm.model.layers[layer].self_attn.o_proj.input[..., head * dim:(head + 1) * dim] = 0
            out = lm.output.save()
        return out.logits

    return naive_loglikelihoods(forward, loaded.tokenizer, items)


def gpu_section(tok, keys: int) -> None:
    """The engine on a random-weight model of Llama-3.1-8B's shape in bf16: one layer's 32 heads
    over 256 KV prompts, with the peak GPU memory."""
    from transformers import AutoModelForCausalLM

    cfg = helpers.paper_config("llama-3.1-8b")
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):
        big = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    big_tok = type("Tok", (), {"pad_token_id": 0, "encode": staticmethod(lambda s: tok.encode(s))})()
    engine = SweepEngine(big, big_tok, helpers.kv_items(keys, 256, seed=0))
    t = time.perf_counter()
    engine.head_sweep(layers=[16], progress=False)
    torch.cuda.synchronize()
    s = time.perf_counter() - t
    print(f"\nGPU ({torch.cuda.get_device_name()}): random-weight Llama-3.1-8B shape, bf16, layer 16 "
          f"(32 heads x 256 prompts): {32 * 256 / s:.0f} ablation-prompts/s, {s / 32:.2f} s per ablation; "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--every", type=int, default=3, help="time the naive loop on one head every N layers")
    parser.add_argument("--top", type=int, default=10, help="heads the screen hands to the exact engine")
    parser.add_argument("--quick", action="store_true", help="8 prompts, naive loop on 3 heads, no full sweep")
    parser.add_argument("--gpu-only", action="store_true", help="only the GPU section (benchmarks/gpu_check.py)")
    args = parser.parse_args()
    if args.gpu_only:
        gpu_section(helpers.load("smollm2-135m-instruct").tokenizer, args.keys)
        return
    if args.quick:
        args.prompts, args.every = 8, 12
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    loaded = helpers.load("smollm2-135m-instruct")
    model, tok, adapter = loaded.model, loaded.tokenizer, loaded.adapter
    items = helpers.kv_items(args.keys, args.prompts, seed=0, query="repeat")
    sample = [(l, (l * 4) % adapter.n_heads(l)) for l in range(0, adapter.n_layers, args.every)]
    n_heads = sum(adapter.n_heads(l) for l in range(adapter.n_layers))
    print(f"SmolLM2-135M-Instruct, {len(items)} KV prompts of {args.keys} keys, {n_heads} heads; "
          f"naive loop timed on {len(sample)} heads: {sample}")

    # 1. The naive loop on the sample heads.
    t = time.perf_counter()
    naive = {}
    for layer, head in sample:
        with helpers.zero_heads(loaded, {layer: [head]}):
            naive[layer, head] = naive_loglikelihoods(lambda ids: model(ids).logits, tok, items)
    naive_s = (time.perf_counter() - t) / len(sample)

    # 1b. Our plain scorer (full sequences, vocabulary only where scored), for the breakdown.
    t = time.perf_counter()
    for layer, head in sample:
        with helpers.zero_heads(loaded, {layer: [head]}):
            helpers.choice_loglikelihoods(model, tok, items)
    scorer_s = (time.perf_counter() - t) / len(sample)

    # 2. The engine on the same heads (its one-off residual pass included), then equality.
    t = time.perf_counter()
    engine = SweepEngine(loaded, tok, items)
    lls = {lh: engine.loglikelihoods([{lh[0]: [lh[1]]}])[0] for lh in sample}
    engine_s = (time.perf_counter() - t) / len(sample)
    diff = max(np.abs(lls[lh] - naive[lh]).max() for lh in sample)
    same_acc = all(engine.score_loglikelihoods(lls[lh]).acc == engine.score_loglikelihoods(naive[lh]).acc for lh in sample)
    print(f"\nexact engine vs naive loop, same {len(sample)} heads:")
    print(f"  naive  {naive_s:7.2f} s per ablation ({len(items) / naive_s:6.1f} ablation-prompts/s)")
    print(f"  scorer {scorer_s:7.2f} s per ablation ({len(items) / scorer_s:6.1f} ablation-prompts/s)"
          "  [helpers.score: full sequences, logits only where scored]")
    print(f"  engine {engine_s:7.2f} s per ablation ({len(items) / engine_s:6.1f} ablation-prompts/s)")
    print(f"  speed-up {naive_s / engine_s:.1f}x (target >= 3x); max |log-lik difference| {diff:.2e}; "
          f"same accuracies: {same_acc}")

    # 3. The screen and its exact check of the top k; plain attribution patching beside it.
    t = time.perf_counter()
    plain = screen.attribution(engine, alpha=1.0)
    plain_s = time.perf_counter() - t
    t = time.perf_counter()
    estimate = screen.attribution(engine, progress=False)
    screens = {"midpoint (alpha=0.5)": estimate, "plain (alpha=1)": plain}
    for lh in sorted(estimate, key=estimate.get)[: args.top]:  # the exact check, timed with the screen
        engine.score({lh[0]: [lh[1]]})
    screen_s = time.perf_counter() - t
    print(f"\nscreen (attribution patching at each layer's midpoint, all {n_heads} heads) + exact engine on its "
          f"top {args.top}: {screen_s:.1f} s; the naive loop over all heads would take {naive_s * n_heads:.0f} s: "
          f"{naive_s * n_heads / screen_s:.0f}x (target >= 30x). Plain attribution patching (one pass): {plain_s:.1f} s")

    if not args.quick:
        t = time.perf_counter()
        full = engine.head_sweep(progress=True)
        full_s = time.perf_counter() - t
        print(f"\nexact engine over all {n_heads} heads: {full_s:.0f} s ({naive_s * n_heads / full_s:.1f}x the naive loop)")
        # Ties in accuracy are broken by the exact change of the mean gold margin.
        base = engine.margins(engine.loglikelihoods([{}])[0]).mean().item()
        worst = sorted(full, key=lambda k: full[k].acc)[:20]
        lls = engine.loglikelihoods([{l: [h]} for l, h in worst])  # side by side, one pass
        margin = {lh: engine.margins(ll).mean().item() - base for lh, ll in zip(worst, lls)}
        exact_order = sorted(full, key=lambda k: (full[k].acc, margin.get(k, 0)))
        exact_top5 = set(exact_order[:5])
        print(f"  exact top 5 by accuracy: {[(k, round(full[k].acc, 3)) for k in exact_order[:5]]}")
        table = pd.DataFrame({"exact_acc": pd.Series({k: v.acc for k, v in full.items()}),
                              **{name: pd.Series(est) for name, est in screens.items()}})
        for name, est in screens.items():
            order = sorted(est, key=est.get)
            checked_top5 = sorted(order[: args.top], key=exact_order.index)[:5]
            rho = table[name].rank().corr(table.exact_acc.rank())
            print(f"  {name}: top 5 {order[:5]}; the exact top 5's places in its order: "
                  f"{[order.index(k) + 1 for k in exact_order[:5]]}")
            print(f"    top-5 recall: its own top 5 {len(exact_top5 & set(order[:5]))} of 5; its top {args.top} "
                  f"checked exactly and re-ranked {len(exact_top5 & set(checked_top5))} of 5 (target >= 4); "
                  f"Spearman rank correlation with exact accuracy over all heads {rho:.2f}")
        out = results_dir("benchmark") / "sweep-heads.csv"
        table.rename_axis(["layer", "head"]).to_csv(out)
        print(f"  per-head table: {out}")
    print("\npeers:")
    print("  TransformerLens: not run; it loads models by hub name (HookedTransformer.from_pretrained), and "
          "the CPU profile has no hub, only SmolLM2's GGUF file")
    if importlib.util.find_spec("nnsight") is None:
        print("  nnsight: not installed (pip install -e '.[bench]' to include it)")
    else:
        t = time.perf_counter()
        peer = {lh: nnsight_naive(loaded, items, *lh) for lh in sample}
        peer_s = (time.perf_counter() - t) / len(sample)
        peer_diff = max(np.abs(peer[lh] - naive[lh]).max() for lh in sample)
        print(f"  nnsight naive loop {peer_s:.2f} s per ablation: the engine is {peer_s / engine_s:.1f}x faster; "
              f"max |log-lik difference| to the naive loop {peer_diff:.2e}")

    if torch.cuda.is_available():
        gpu_section(tok, args.keys)


if __name__ == "__main__":
    main()
