"""The PNG of benchmarks/engine/vs_peers.py: one panel per (model, thread count), a group of
bars per shape and batch (tokens/s end to end, or prefill seconds for long prompts), one bar
per engine, labelled with surge / peer (for prefill: peer / surge, > 1 = surge faster)."""

from pathlib import Path


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    panels = sorted({(r["model"], str(r["threads"])) for r in res})
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (model, threads) in zip(axes[:, 0], panels, strict=True):
        rows = [r for r in res if r["model"] == model and str(r["threads"]) == threads]
        engines = [e for e in ("surge", "surge-eager", "transformers", "vllm") if
                   any(e in r for r in rows)]  # fmt: skip
        width = 0.8 / len(engines)
        for k, e in enumerate(engines):
            for i, r in enumerate(rows):
                if e not in r:
                    continue
                x = i + (k - (len(engines) - 1) / 2) * width
                long = r["shape"] == "long_prompt"
                y = r[e]["prefill_s"] if long else r[e]["e2e_tok_s"]
                y = 1 / y if long else y  # prompts per second: higher is better everywhere
                ax.bar(x, y, width, color=f"C{k}", label=e if i == 0 else None)
                if e == r["surge_reference"]:
                    continue
                key = e.replace("-", "_")
                ratio = r.get(f"{key}_over_surge_prefill_s" if long else
                              f"surge_over_{key}_e2e_tok_s")  # fmt: skip
                if ratio is not None:
                    ax.text(x, y, f"{ratio:.2f}x", ha="center", va="bottom", fontsize=7)
        labels = [f"{r['shape']} b{r['batch']}\n{r['prompt_len']}+{r['new_tokens']}" for r in rows]
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("tok/s e2e (long: prompts/s)", fontsize=8)
        ax.set_title(f"{model}, threads {threads} (labels: surge/peer; long prompts: peer/surge s)",
                     fontsize=9)  # fmt: skip
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
