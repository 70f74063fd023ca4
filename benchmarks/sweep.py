"""Head-ablation sweeps several ways, in one process, on the same prompts:

1. the naive loop (the released code's): for every ablation, a forward pass of every
   (prompt, candidate) sequence with full logits;
2. the exact engine (`helpers.engine.SweepEngine`);
3. the same naive loop through the peers, where installed (`pip install -e '.[bench]'`):
   nnsight (the head's slice of o_proj's input set to zero in a trace) and TransformerLens 4.x
   (`TransformerBridge` wrapping the loaded model, `blocks.L.attn.hook_z` zeroed for the head);
4. the screen: attribution patching over all heads (at each layer's midpoint, and plain), then
   the engine on its top k;
5. a scaling table: per-ablation time and peak resident memory of the engine and of
   TransformerLens against the number of prompts and the number of heads swept.

It prints throughput ratios measured side by side (absolute seconds on a shared machine mean
little), checks that the engine's and the peers' log-likelihoods equal the naive loop's, and
reports how well the screen's ranking matches the exact one. With CUDA present it also times the
engine on a random-weight model of Llama-3.1-8B's shape (bf16).

    python benchmarks/sweep.py            # SmolLM2-135M on CPU, 40 KV prompts of 8 keys
    python benchmarks/sweep.py --quick    # fewer prompts and heads, for a smoke run

Peak memory is the process's resident set above what it held when a configuration started: the
kernel's high-water mark (VmHWM), reset before each configuration through /proc/self/clear_refs
after garbage collection and malloc_trim (Linux only; elsewhere the column says n/a).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
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
from helpers.registry import spec
from helpers.specs import Spec


@torch.inference_mode()
def naive_loglikelihoods(forward, tokenizer, items, batch_size: int = 32) -> np.ndarray:
    """One right-padded forward pass per batch of full sequences (`forward(ids) -> logits`),
    log-softmax over the whole vocabulary at every position, then the continuation's tokens
    gathered (the release's way)."""
    seqs = [encode_pair(tokenizer, c, x, it.verbatim) for it in items for c, x in it.pairs]
    out = np.zeros(len(seqs))
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start : start + batch_size]
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
            lm.model.layers[layer].self_attn.o_proj.input[..., head * dim : (head + 1) * dim] = 0
            out = lm.output.save()
        return out.logits

    return naive_loglikelihoods(forward, loaded.tokenizer, items)


def transformerlens_bridge(loaded):
    """TransformerLens 4.x's bridge around a copy of the loaded model, with no hub call:
    (bridge, "") or (None, why not). Booting swaps the model's submodules for the bridge's own in
    place, switches it to eager attention and normalises the tokenizer, so it gets copies: the
    model that the naive loop and the engine run stays as loaded."""
    if importlib.util.find_spec("transformer_lens") is None:
        return None, "not installed (pip install -e '.[bench]' to include it)"
    name = spec(loaded.name).hub_id
    try:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(
            name,
            hf_model=copy.deepcopy(loaded.model),
            tokenizer=copy.deepcopy(loaded.tokenizer),
            device=str(next(loaded.model.parameters()).device),
            dtype=next(loaded.model.parameters()).dtype,
        )
    except Exception as error:  # any failure to wrap is reported, not hidden
        return (
            None,
            f"cannot wrap the loaded {name} offline: {type(error).__name__}: {str(error)[:300]}",
        )
    return bridge, ""


def transformerlens_naive(bridge, tokenizer, items, layer: int, head: int) -> np.ndarray:
    """The naive loop through TransformerLens: the head's output (`hook_z`, [batch, position,
    head, d_head], what enters the output projection) set to zero."""

    def zero(z, hook):
        z[:, :, head, :] = 0.0
        return z

    hooks = [(f"blocks.{layer}.attn.hook_z", zero)]
    return naive_loglikelihoods(
        lambda ids: bridge.run_with_hooks(ids, return_type="logits", fwd_hooks=hooks),
        tokenizer,
        items,
    )


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def measured(run):
    """(result, seconds, peak resident bytes above the start or None) of `run()`. The peak is the
    kernel's high-water mark, reset at the start (Linux: /proc/self/clear_refs); freed memory
    is first handed back (gc, malloc_trim) so that the start is what is really held."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the start may include freed memory, so the peak reads low
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size to the current one
        start = _status_kib("VmRSS")
    except OSError:
        start = None
    t = time.perf_counter()
    out = run()
    seconds = time.perf_counter() - t
    peak = None if start is None else (_status_kib("VmHWM") - start) * 1024
    return out, seconds, peak


def scaling_cells(adapter, layer: int) -> list[tuple[int, int]]:
    """Every head of `layer` and the layers above, in order: the scaling table's ablations."""
    return [(l, h) for l in range(layer, adapter.n_layers) for h in range(adapter.n_heads(l))]


def check_scaling(adapter, args) -> None:
    """The scaling table's sizes, checked before any timing."""
    if not 0 <= args.scaling_layer < adapter.n_layers:
        raise SystemExit(
            f"--scaling-layer {args.scaling_layer}: the model has layers 0..{adapter.n_layers - 1}"
        )
    cells = scaling_cells(adapter, args.scaling_layer)
    if max(args.scaling_heads) > len(cells):
        raise SystemExit(
            f"--scaling-heads {max(args.scaling_heads)}: layers {args.scaling_layer} and up have only "
            f"{len(cells)} heads; lower --scaling-layer or the head counts"
        )
    if max(args.scaling_prompts) > args.prompts:
        raise SystemExit(
            f"--scaling-prompts {max(args.scaling_prompts)}: more than the {args.prompts} prompts made; "
            f"raise --prompts"
        )


def scaling_table(
    loaded, bridge, items, prompts: list[int], heads: list[int], layer: int
) -> pd.DataFrame:
    """Per-ablation seconds and peak memory of the engine and of TransformerLens (None: not
    run) over the first n prompts, zeroing the first h heads counted from `layer` upwards one at
    a time: varying n at the middle h, then h at the largest n. The engine's time includes its
    one-off residual pass and its construction."""
    tok, cells = loaded.tokenizer, scaling_cells(loaded.adapter, layer)
    middle = sorted(heads)[len(heads) // 2]
    configs = [("prompts", n, middle) for n in prompts] + [
        ("heads", max(prompts), h) for h in heads
    ]
    # One untimed pass of each first: the first call of a path pays one-off costs (allocator
    # growth, lazy initialisation) that would otherwise land on the first configuration.
    SweepEngine(loaded, tok, items[:1]).score_each({cells[0]: Spec(zero=[cells[0]])})
    if bridge is not None:
        transformerlens_naive(bridge, tok, items[:1], *cells[0])
    rows = []
    for axis, n, h in configs:
        subset, swept = items[:n], cells[:h]

        def engine_run():
            engine = SweepEngine(loaded, tok, subset)
            return engine.score_each({lh: Spec(zero=[lh]) for lh in swept})

        _, engine_s, engine_peak = measured(engine_run)
        row = {
            "varied": axis,
            "prompts": n,
            "heads": h,
            "engine s/ablation": engine_s / h,
            "engine peak MiB": engine_peak and engine_peak / 2**20,
        }
        if bridge is not None:
            _, tl_s, tl_peak = measured(
                lambda: [transformerlens_naive(bridge, tok, subset, *lh) for lh in swept]
            )
            row |= {
                "TransformerLens s/ablation": tl_s / h,
                "TransformerLens peak MiB": tl_peak and tl_peak / 2**20,
                "TransformerLens / engine time": tl_s / engine_s,
            }
        rows.append(row)
    return pd.DataFrame(rows)


def gpu_section(tok, keys: int) -> None:
    """The engine on a random-weight model of Llama-3.1-8B's shape in bf16: one layer's 32 heads
    over 256 KV prompts, with the peak GPU memory."""
    from transformers import AutoModelForCausalLM

    cfg = helpers.paper_config("llama-3.1-8b")
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):
        big = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    big_tok = type(
        "Tok", (), {"pad_token_id": 0, "encode": staticmethod(lambda s: tok.encode(s))}
    )()
    engine = SweepEngine(big, big_tok, helpers.kv_items(keys, 256, seed=0))
    t = time.perf_counter()
    engine.head_sweep(layers=[16], progress=False)
    torch.cuda.synchronize()
    s = time.perf_counter() - t
    print(
        f"\nGPU ({torch.cuda.get_device_name()}): random-weight Llama-3.1-8B shape, bf16, layer 16 "
        f"(32 heads x 256 prompts): {32 * 256 / s:.0f} ablation-prompts/s, {s / 32:.2f} s per ablation; "
        f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give positive integers separated by commas, e.g. 10,20,40"
        )
    return sizes


def naive_and_engine(loaded, items, sample):
    """The naive loop and the engine (its one-off residual pass included) on the same heads:
    seconds per ablation and log-likelihoods of each, and the engine."""
    t = time.perf_counter()
    naive = {}
    for layer, head in sample:
        with helpers.zero_heads(loaded, {layer: [head]}):
            naive[layer, head] = naive_loglikelihoods(
                lambda ids: loaded.model(ids).logits, loaded.tokenizer, items
            )
    naive_s = (time.perf_counter() - t) / len(sample)
    t = time.perf_counter()
    engine = SweepEngine(loaded, loaded.tokenizer, items)
    lls = {lh: engine.loglikelihoods([Spec(zero=[lh])])[0] for lh in sample}
    return naive_s, naive, (time.perf_counter() - t) / len(sample), lls, engine


def dtype_line(loaded, items, sample) -> str:
    """One line: the engine's speed-up over the naive loop, and how far their log-likelihoods
    differ (float32: equal to 2e-4, as the tests require; bfloat16: its rounding, stated)."""
    naive_s, naive, engine_s, lls, engine = naive_and_engine(loaded, items, sample)
    diff = max(np.abs(lls[lh] - naive[lh]).max() for lh in sample)
    same = sum(
        engine.score_loglikelihoods(lls[lh]).acc == engine.score_loglikelihoods(naive[lh]).acc
        for lh in sample
    )
    dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    verdict = (
        f"equal to 2e-4: {diff <= 2e-4}"
        if dtype == "float32"
        else "bfloat16 rounding, which a batch's padded width changes: the two pad differently"
    )
    return (
        f"{dtype:9} naive {naive_s:6.2f} s, engine {engine_s:6.2f} s per ablation: {naive_s / engine_s:5.1f}x "
        f"(target >= 20x); max |log-lik difference| {diff:.1e} ({verdict}); same accuracy on {same} of "
        f"{len(sample)} heads"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument(
        "--every", type=int, default=3, help="time the naive loop on one head every N layers"
    )
    parser.add_argument(
        "--top", type=int, default=10, help="heads the screen hands to the exact engine"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="8 prompts, naive loop on 3 heads, no full sweep, "
        "scaling at 4,8 prompts and 2,4 heads",
    )
    parser.add_argument(
        "--gpu-only", action="store_true", help="only the GPU section (benchmarks/gpu_check.py)"
    )
    parser.add_argument(
        "--scaling-prompts",
        type=_sizes,
        default=[10, 20, 40],
        help="prompt counts of the scaling table (at most --prompts), comma-separated",
    )
    parser.add_argument(
        "--scaling-heads",
        type=_sizes,
        default=[4, 9, 18],
        help="heads swept in the scaling table, comma-separated",
    )
    parser.add_argument(
        "--scaling-layer",
        type=int,
        default=15,
        help="the scaling table zeroes heads from this layer up",
    )
    args = parser.parse_args()
    if args.gpu_only:
        gpu_section(helpers.load("smollm2-135m-instruct").tokenizer, args.keys)
        return
    if args.quick:
        args.prompts, args.every = 8, 12
        args.scaling_prompts, args.scaling_heads = [4, 8], [2, 4]
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    loaded = helpers.load("smollm2-135m-instruct")
    model, tok, adapter = loaded.model, loaded.tokenizer, loaded.adapter
    check_scaling(adapter, args)
    items = helpers.kv_items(args.keys, args.prompts, seed=0, query="repeat")
    sample = [(l, (l * 4) % adapter.n_heads(l)) for l in range(0, adapter.n_layers, args.every)]
    n_heads = sum(adapter.n_heads(l) for l in range(adapter.n_layers))
    print(
        f"SmolLM2-135M-Instruct, {len(items)} KV prompts of {args.keys} keys, {n_heads} heads; "
        f"naive loop timed on {len(sample)} heads: {sample}"
    )

    # 0. The engine against the naive loop in each dtype, on the same heads.
    print("\nengine against the naive loop, per dtype (same heads, same prompts, one process):")
    for dtype in (torch.float32, torch.bfloat16):
        print("  " + dtype_line(helpers.load("smollm2-135m-instruct", dtype=dtype), items, sample))

    # 1-2. The naive loop and the engine on the sample heads, then equality.
    naive_s, naive, engine_s, lls, engine = naive_and_engine(loaded, items, sample)
    diff = max(np.abs(lls[lh] - naive[lh]).max() for lh in sample)
    same_acc = all(
        engine.score_loglikelihoods(lls[lh]).acc == engine.score_loglikelihoods(naive[lh]).acc
        for lh in sample
    )

    # 1b. Our plain scorer (full sequences, vocabulary only where scored), for the breakdown.
    t = time.perf_counter()
    for layer, head in sample:
        with helpers.zero_heads(loaded, {layer: [head]}):
            helpers.choice_loglikelihoods(model, tok, items)
    scorer_s = (time.perf_counter() - t) / len(sample)

    # 2b. The peers: the same naive loop through nnsight and through TransformerLens, same heads.
    peers, missing = {}, {}
    if importlib.util.find_spec("nnsight") is None:
        missing["nnsight"] = "not installed (pip install -e '.[bench]' to include it)"
    else:
        t = time.perf_counter()
        peer = {lh: nnsight_naive(loaded, items, *lh) for lh in sample}
        peers["nnsight"] = ((time.perf_counter() - t) / len(sample), peer)
    bridge, why = transformerlens_bridge(loaded)
    if bridge is None:
        missing["TransformerLens"] = why
    else:
        t = time.perf_counter()
        peer = {lh: transformerlens_naive(bridge, tok, items, *lh) for lh in sample}
        peers["TransformerLens"] = ((time.perf_counter() - t) / len(sample), peer)

    print(
        f"\nper ablation, same {len(sample)} heads, same run (ratios: the engine's speed-up over each):"
    )
    print(
        f"  naive loop       {naive_s:7.2f} s ({len(items) / naive_s:6.1f} ablation-prompts/s)  "
        f"engine {naive_s / engine_s:5.1f}x faster (target >= 3x)"
    )
    print(
        f"  scorer           {scorer_s:7.2f} s ({len(items) / scorer_s:6.1f} ablation-prompts/s)  "
        f"engine {scorer_s / engine_s:5.1f}x faster  [helpers.score: full sequences, logits only where scored]"
    )
    for name, (peer_s, peer) in peers.items():
        peer_diff = max(np.abs(peer[lh] - naive[lh]).max() for lh in sample)
        engine_diff = max(np.abs(peer[lh] - lls[lh]).max() for lh in sample)
        print(
            f"  {name:16} {peer_s:7.2f} s ({len(items) / peer_s:6.1f} ablation-prompts/s)  "
            f"engine {peer_s / engine_s:5.1f}x faster; max |log-lik difference| to the naive loop "
            f"{peer_diff:.2e}, to the engine {engine_diff:.2e}"
        )
    print(
        f"  engine           {engine_s:7.2f} s ({len(items) / engine_s:6.1f} ablation-prompts/s)  "
        f"max |log-lik difference| to the naive loop {diff:.2e}; same accuracies: {same_acc}"
    )
    for name, why in missing.items():
        print(f"  {name}: not run: {why}")
    if "TransformerLens" in peers:
        print(
            "  (TransformerLens wraps a copy of the model and computes attention eagerly, as its bridge "
            "requires; the others use PyTorch's SDPA: the log-likelihoods differ by rounding only)"
        )

    # 3. The screen and its exact check of the top k; plain attribution patching beside it.
    t = time.perf_counter()
    plain = screen.attribution(engine, alpha=1.0)
    plain_s = time.perf_counter() - t
    t = time.perf_counter()
    estimate = screen.attribution(engine, progress=False)
    screens = {"midpoint (alpha=0.5)": estimate, "plain (alpha=1)": plain}
    # the exact check, timed with the screen
    for lh in sorted(estimate, key=estimate.get)[: args.top]:
        engine.score({lh[0]: [lh[1]]})
    screen_s = time.perf_counter() - t
    print(
        f"\nscreen (attribution patching at each layer's midpoint, all {n_heads} heads) + exact engine on its "
        f"top {args.top}: {screen_s:.1f} s; the naive loop over all heads would take {naive_s * n_heads:.0f} s: "
        f"{naive_s * n_heads / screen_s:.0f}x (target >= 30x). Plain attribution patching (one pass): {plain_s:.1f} s"
    )

    if not args.quick:
        t = time.perf_counter()
        full = engine.head_sweep(progress=True)
        full_s = time.perf_counter() - t
        print(
            f"\nexact engine over all {n_heads} heads: {full_s:.0f} s ({naive_s * n_heads / full_s:.1f}x the naive loop)"
        )
        # Ties in accuracy are broken by the exact change of the mean gold margin.
        base = engine.margins(engine.loglikelihoods([Spec()])[0]).mean().item()
        worst = sorted(full, key=lambda k: full[k].acc)[:20]
        lls = engine.loglikelihoods([Spec(zero=[lh]) for lh in worst])  # side by side, one pass
        margin = {lh: engine.margins(ll).mean().item() - base for lh, ll in zip(worst, lls)}
        exact_order = sorted(full, key=lambda k: (full[k].acc, margin.get(k, 0)))
        exact_top5 = set(exact_order[:5])
        print(f"  exact top 5 by accuracy: {[(k, round(full[k].acc, 3)) for k in exact_order[:5]]}")
        table = pd.DataFrame(
            {
                "exact_acc": pd.Series({k: v.acc for k, v in full.items()}),
                **{name: pd.Series(est) for name, est in screens.items()},
            }
        )
        for name, est in screens.items():
            order = sorted(est, key=est.get)
            checked_top5 = sorted(order[: args.top], key=exact_order.index)[:5]
            rho = table[name].rank().corr(table.exact_acc.rank())
            print(
                f"  {name}: top 5 {order[:5]}; the exact top 5's places in its order: "
                f"{[order.index(k) + 1 for k in exact_order[:5]]}"
            )
            print(
                f"    top-5 recall: its own top 5 {len(exact_top5 & set(order[:5]))} of 5; its top {args.top} "
                f"checked exactly and re-ranked {len(exact_top5 & set(checked_top5))} of 5 (target >= 4); "
                f"Spearman rank correlation with exact accuracy over all heads {rho:.2f}"
            )
        out = results_dir("benchmark") / "sweep-heads.csv"
        table.rename_axis(["layer", "head"]).to_csv(out)
        print(f"  per-head table: {out}")
    # 5. How cost grows: per-ablation time and peak memory against prompts and heads swept.
    table = scaling_table(
        loaded, bridge, items, args.scaling_prompts, args.scaling_heads, args.scaling_layer
    )
    print(
        f"\nscaling (heads zeroed one at a time from layer {args.scaling_layer} up; peak: resident memory above "
        f"the start of each configuration, from the kernel's high-water mark reset per configuration):"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if bridge is None:
        print(f"  TransformerLens not run: {why}")
    out = results_dir("benchmark") / "sweep-scaling.csv"
    table.to_csv(out, index=False)
    print(f"  scaling table: {out}")

    if torch.cuda.is_available():
        gpu_section(tok, args.keys)


if __name__ == "__main__":
    main()
