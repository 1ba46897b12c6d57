"""hx-bench: step time of every communication scheme on an emulated network, side by side.

    hx-bench --workers 2 --bandwidth 1gbit --model bfa --steps 20 --json OUT.json
    hx-bench --workers 2 --bandwidth 100mbit,1gbit,10gbit --json OUT.json      # one run, three links
    hx-bench convergence [...]                                                 # final loss per codec
    hx-bench codec [--numel 22000000]                       # compress/decompress s and GB/s per codec, one thread
    hx-bench hosts up 2 --bandwidth 1gbit                   # emulated hosts for any horovodrun job (see --help)
    hx-bench predict RUN.json [RUN.json ...]                # cost model: fit, per-point error, 2-1024 workers

For each bandwidth it creates one Linux network namespace per worker, joined by veth pairs to a
bridge and shaped with tc (tbf) in both directions, launches the workers there with horovodrun,
and deletes the namespaces afterwards (also on Ctrl-C). Per method it reports the median step
time over --steps steps after --warmup, the compute-only time (measured again beside each method,
half the steps before it and half after, because this host's speed drifts within a run), the exposed
communication, bytes per step and, for ours, the limit max(compute beside it, wire bytes / bandwidth). Methods: Horovod fp32 and
fp16 (hvd.DistributedOptimizer), PyTorch DDP over Gloo plain and with the PowerSGD hook, and each
horovod_ext codec with and without pipelining. Writes JSON (one record per method and bandwidth)
and a PNG of step time against bandwidth. Needs root (namespaces, tc); --no-netns runs unshaped
on localhost instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from .launch import horovodrun

DEFAULT_HX = "fp16,bf16,global_qsgd8,global_qsgd4,topk0.01,random_block0.01,powersgd4"
BASELINES = "hvd_fp32,hvd_fp16,ddp,ddp_powersgd"
SETTINGS = {  # batch x frames per worker
    "bfa": {"comm-bound": (1, 40), "compute-bound": (2, 200)},
    "small": {"comm-bound": (8, 1), "compute-bound": (2048, 1)},
}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hx-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="workers (one namespace each), default 2")
    p.add_argument("--bandwidth", default="1gbit",
                   help="link rate per worker, tc units; comma-separated for several (default 1gbit)")
    p.add_argument("--latency-ms", type=float, default=0.0,
                   help="added one-way latency per link (needs the netem qdisc; default 0)")
    p.add_argument("--model", choices=["bfa", "small"], default="bfa",
                   help="bfa: 22M-parameter BiLSTM stand-in for the recipe's model; small: 1.3M-parameter MLP")
    p.add_argument("--setting", choices=["comm-bound", "compute-bound", "both"], default="comm-bound",
                   help="comm-bound: a batch at which Horovod fp32 mostly communicates at 1 Gbit/s; "
                        "compute-bound: a large batch, so nobody is misled (default comm-bound)")
    p.add_argument("--batch", type=int, help="override the setting's batch per worker")
    p.add_argument("--frames", type=int, help="override the setting's frames per example (bfa)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per method after warm-up (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per method (default 5; adaptive transport decides after warmup-2)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated; baselines {BASELINES}; ours hx_SPEC and hx_SPEC+pipe, SlowMo as "
                        f"hx_slowmo<tau>[-<codec>] and Gossip as hx_gossip-ring|exp[-a<k>] (their step figure is the "
                        f"mean over the timed steps, not the median) (default: all baselines and hx_ for {DEFAULT_HX}, with and without +pipe)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--no-adaptive", action="store_true",
                   help="turn the adaptive cost rule off, so every hx method compresses and its own speed shows "
                        "(tensors under 8,192 elements still go fp32); the decision is in the JSON either way")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole comparison this many times, one after the other; the table then shows "
                        "whether the adaptive rule decided alike in every run (default 1)")
    p.add_argument("--powersgd-rank", type=int, default=4, help="rank of DDP's PowerSGD hook (default 4; compare "
                                                                 "with hx_powersgd4 at equal rank)")
    p.add_argument("--no-netns", action="store_true", help="run on localhost without shaping (no root needed)")
    p.add_argument("--json", default="out/hx-bench.json", help="output JSON (default out/hx-bench.json)")
    p.add_argument("--plot", default=None, help="output PNG (default: the JSON path with .png)")
    return p.parse_args(argv)


def default_methods() -> str:
    ours = [f"hx_{s}{suffix}" for s in DEFAULT_HX.split(",") for suffix in ("", "+pipe")]
    return ",".join(BASELINES.split(",") + ours)


def run_one(args, bandwidth: str, setting: str, out_jsonl: str) -> int:
    from .netns import ShapedNetwork, parse_rate, write_ssh_shim
    batch, frames = SETTINGS[args.model][setting]
    batch, frames = args.batch or batch, args.frames or frames
    worker = [sys.executable, "-m", "horovod_ext.bench.stepbench", "--model", args.model,
              "--batch", str(batch), "--frames", str(frames), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--methods", args.methods, "--threads", str(args.threads),
              "--powersgd-rank", str(args.powersgd_rank), *(["--no-adaptive"] if args.no_adaptive else []),
              "--bandwidth", bandwidth if not args.no_netns else "unshaped", "--setting", setting,
              "--out-jsonl", out_jsonl]
    import subprocess
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.no_netns:
        cmd = [horovodrun(), "-np", str(args.workers), "-H", f"localhost:{args.workers}", "--gloo", *worker]
        print("+", " ".join(cmd), flush=True)
        return subprocess.call(cmd, env=env)
    rate = parse_rate(bandwidth)
    worker += ["--bandwidth-bps", str(rate)]
    with ShapedNetwork(args.workers, bandwidth, args.latency_ms) as net:
        shim = write_ssh_shim(net)
        env["PATH"] = shim + os.pathsep + env["PATH"]
        cmd = [horovodrun(), "-np", str(args.workers), "-H", net.hosts, "--gloo",
               "--network-interface", "hxnet0", *worker]
        print(f"+ [{bandwidth} per worker, namespaces {net.namespace(0)}..] " + " ".join(cmd), flush=True)
        return subprocess.call(cmd, env=env)


def summarize(records) -> None:
    groups = {}
    for r in records:
        groups.setdefault((r["setting"], r["bandwidth"]), []).append(r)
    for (setting, bw), recs in groups.items():
        by = {r["method"]: r for r in recs}
        fp32 = by.get("hvd_fp32")
        print(f"\n## {recs[0]['model']} ({recs[0]['parameters'] / 1e6:.1f}M parameters), {recs[0]['workers']} workers, "
              f"{bw}, {setting} (batch {recs[0]['batch']} x {recs[0]['frames']})")
        if fp32:
            print(f"Horovod fp32 spends {100 * fp32['comm_fraction']:.0f}% of its step communicating "
                  f"(compute alone {fp32['compute_s']:.3f} s)")
        print("| method | median step s | vs hvd fp32 | compute beside s | limit s | step/limit | waited s | MB per step "
              "| adaptive |\n|---|---|---|---|---|---|---|---|---|")
        for r in recs:
            rel = f"{r['median_step_s'] / fp32['median_step_s']:.2f}x" if fp32 else ""
            lim = r.get("limit_s")
            lim_s = "" if lim is None else f"{lim:.3f}"
            ratio = "" if not lim else f"{r['median_step_s'] / lim:.2f}"
            # ours: the seconds per step the training thread waited for reductions after backward (the
            # communication not hidden; a Horovod timeline, HOROVOD_TIMELINE=file, shows what it waited for)
            waited = "" if r.get("wait_s") is None else f"{r['wait_s']:.3f}"
            beside = "" if r["method"] == "compute_only" or r.get("compute_s") is None else f"{r['compute_s']:.3f}"
            print(f"| {r['method']} | {r['median_step_s']:.3f} | {rel} | {beside} | {lim_s} | {ratio} | {waited} | "
                  f"{r.get('bytes_per_step', 0) / 1e6:.2f} | {decision(r)} |")


def decision(r: dict) -> str:
    """The adaptive rule's verdict for one record, in words (empty for methods that are not ours)."""
    a = r.get("adaptive")
    if not a:
        return ""
    if not a.get("enabled"):
        return "rule off"
    if not a.get("decided"):
        return "undecided"
    if a.get("saved_s_per_element") is None:
        return "compress (link rate unknown)"
    cost, saved = a["codec_s_per_element"] * 1e9, a["saved_s_per_element"] * 1e9
    backend = (a.get("backend_s_per_element") or 0.0) * 1e9
    cost_s = f"{cost:.2f} + {backend:.2f} backend" if backend else f"{cost:.2f}"
    return f"{'compress' if a['compress'] else 'fp32'} ({cost_s} vs {saved:.2f} ns/el)"


def summarize_decisions(records, repeats: int) -> None:
    """Per method: the adaptive verdict of every run, and whether they agree."""
    print(f"\n## adaptive decisions in {repeats} runs")
    print("| setting | bandwidth | method | " + " | ".join(f"run {i + 1}" for i in range(repeats)) + " | same |")
    print("|---|---|---|" + "---|" * repeats + "---|")
    keys = list(dict.fromkeys((r["setting"], r["bandwidth"], r["method"]) for r in records if r.get("adaptive")))
    for key in keys:
        runs = {r["repeat"]: r for r in records if (r["setting"], r["bandwidth"], r["method"]) == key}
        verdicts = [("compress" if runs[i]["adaptive"]["compress"] else "fp32") if i in runs else "-"
                    for i in range(repeats)]
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(verdicts) + f" | {'yes' if len(set(verdicts)) == 1 else 'NO'} |")


def plot(records, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    settings = sorted({r["setting"] for r in records})
    fig, axes = plt.subplots(1, len(settings), figsize=(7 * len(settings), 5), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        recs = [r for r in records if r["setting"] == setting and r["method"] != "compute_only"]
        methods = list(dict.fromkeys(r["method"] for r in recs))
        for m in methods:
            pts = sorted((r["bandwidth_bps"] or 0, r["median_step_s"]) for r in recs if r["method"] == m)
            xs = [p[0] / 1e9 for p in pts]
            style = "-o" if m.startswith("hx_") else "--s"
            ax.plot(xs, [p[1] for p in pts], style, label=m, markersize=4)
        comp = [r for r in records if r["setting"] == setting and r["method"] == "compute_only"]
        if comp:
            ax.axhline(comp[0]["median_step_s"], color="k", lw=0.8, ls=":", label="compute only")
        ax.set_xscale("log")
        ax.set_xlabel("link bandwidth per worker (Gbit/s)")
        ax.set_ylabel("median step time (s)")
        ax.set_title(f"{records[0]['model']}, {records[0]['workers']} workers, {setting}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "convergence":
        from .convergence import main as convergence
        return convergence(argv[1:])
    if argv and argv[0] == "codec":
        from .codec import main as codec
        return codec(argv[1:])
    if argv and argv[0] == "hosts":
        from .hosts import main as hosts
        return hosts(argv[1:])
    if argv and argv[0] == "predict":
        from .predict import main as predict
        return predict(argv[1:])
    args = parse_args(argv)
    args.methods = args.methods or default_methods()
    settings = ["comm-bound", "compute-bound"] if args.setting == "both" else [args.setting]
    bandwidths = ["unshaped"] if args.no_netns else [b.strip() for b in args.bandwidth.split(",")]
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    rc = 0
    records = []
    for repeat in range(args.repeat):
        for setting in settings:
            for bw in bandwidths:
                out_jsonl = tempfile.mktemp(prefix="hx-bench-", suffix=".jsonl")
                rc = run_one(args, bw, setting, out_jsonl) or rc
                if os.path.exists(out_jsonl):
                    with open(out_jsonl) as f:
                        records += [dict(json.loads(line), repeat=repeat) for line in f if line.strip()]
                    os.unlink(out_jsonl)
    if not records:
        print("hx-bench: no results (see the errors above)", file=sys.stderr)
        return rc or 1
    with open(args.json, "w") as f:
        json.dump({"command": "hx-bench " + " ".join(argv), "records": records}, f, indent=1)
    for repeat in range(args.repeat):
        if args.repeat > 1:
            print(f"\n# run {repeat + 1} of {args.repeat}")
        summarize([r for r in records if r["repeat"] == repeat])
    if args.repeat > 1:
        summarize_decisions(records, args.repeat)
    png = args.plot or os.path.splitext(args.json)[0] + ".png"
    plot([r for r in records if r["repeat"] == 0], png)
    print(f"\nwrote {args.json} and {png}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
