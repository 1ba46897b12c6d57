"""hx-bench predict: an alpha-beta cost model of a training step, fitted to hx-bench runs, checked
point by point, and used to predict scaling from 2 to 1024 workers.

    hx-bench --workers 3 --bandwidth 100mbit,1gbit,10gbit --no-adaptive --json out/w3.json   # measure
    hx-bench predict out/w2.json out/w3.json out/w4.json --json out/predict.json            # fit, check, predict

The model of one step of a method at n workers on links of B bit/s (each worker's full-duplex link):

* compute C (s): measured alone, the median of the run's figures (hx-bench's ``compute_only`` at the start,
  and the ``compute_s`` it measured beside each method);
* codec K (s): the method's compress + decompress seconds per step, measured at that point;
* wire bytes one worker sends per step, by the textbook cost of each collective: ring allreduce
  2(n-1)/n of the payload, allgather (n-1) times each worker's payload (top-k), and the bf16
  two-phase transport (alltoall reduce-scatter + allgather) 2(n-1)/n of its payload;
* T_comm = wire * 8 / (eta * B) + hops * alpha + rho * (fp16 elements summed, slowed by the share of a
  core each worker had where workers outnumbered the measuring host's cores): eta is the share of
  the link rate the transport reaches (eta_alltoall for the bf16 transport's alltoall, which Gloo
  runs at its own rate), alpha the latency of one ring hop (2(n-1) hops per
  allreduce, n-1 per allgather, counted once per phase of a codec: Global-QSGD and PowerSGD have
  two dependent phases), rho the CPU cost per element of a float16 sum (Gloo sums float16 one
  element at a time on the CPU; 0 on GPUs, where NCCL sums natively);
* without pipelining the collectives overlap backward: step = C + K + max(0, T_comm - omega * C);
  pipelined (step t's reduction runs during step t+1): step = max(C + K, T_comm).

eta, alpha, rho and omega are fitted to every measured point at once (least squares on the relative
error, scipy), and the prediction error is reported per point. Predictions then take a stated
compute time and model size, the fitted constants (or given ones), and each codec's bytes per
element; Global-QSGD with b bits needs n <= 2**(b-1) - 1 workers (the lane width; 8-bit: 127), past
which the table says so. Scaling efficiency is C / step.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

#: fitted constants: (name, initial value, lower bound, upper bound)
PARAMS = (("eta", 0.8, 0.05, 1.5), ("eta_alltoall", 0.8, 0.05, 1.5), ("alpha_s", 5e-5, 0.0, 5e-3),
          ("rho_fp16_s", 1e-8, 0.0, 1e-6), ("omega", 0.5, 0.0, 1.0))


def phases(method: str) -> int:
    """Dependent collective phases per step (each pays its own latency)."""
    return 2 if any(k in method for k in ("global_qsgd", "powersgd")) else 1


def pipelined(method: str) -> bool:
    return method.endswith("+pipe")


def fp16_transport(method: str) -> bool:
    """Methods whose payload Gloo sums as float16 (Horovod's Compression.fp16 and our fp16 cast)."""
    return method in ("hvd_fp16", "hx_fp16", "hx_fp16+pipe")


def payload(rec: dict) -> tuple[float, float, float]:
    """What one worker hands over per step, as n-independent payloads: (allreduce bytes, allgather
    bytes per worker (top-k), two-phase bytes (bf16: the whole payload, of which an alltoall sends
    (n-1)/n and an allgather hands 1/n))."""
    n = rec["workers"]
    ar = rec.get("bytes_allreduce_per_step", rec.get("bytes_per_step", 0.0)) or 0.0
    ag = rec.get("bytes_allgather_per_step", 0.0) or 0.0
    a2a = rec.get("bytes_alltoall_per_step", 0.0) or 0.0
    if a2a:
        return ar, 0.0, a2a * n / max(n - 1, 1)
    return ar, ag, 0.0


def wire_bytes(ar: float, ag: float, n: int, tp: float = 0.0) -> float:
    """Bytes one worker sends per step (ring allreduce, allgather, two-phase), as CommStats counts them."""
    return 2 * (n - 1) / n * ar + (n - 1) * ag + 2 * (n - 1) / n * tp


def hops(method: str, ar: float, ag: float, n: int, tp: float = 0.0) -> float:
    per_phase = (2 * (n - 1) if ar else 0) + ((n - 1) if ag else 0)
    return phases(method) * per_phase + (2 * (n - 1) if tp else 0)


def comm_time(p: dict, method: str, n: int, bps: float, ar: float, ag: float, tp: float, elements: float,
              share: float = 1.0) -> float:
    """``share``: cores per worker process below 1 (more workers than cores on the measuring host)
    slows the CPU-bound float16 sum by 1 / share."""
    t = (2 * (n - 1) / n * ar + (n - 1) * ag + (n - 1) / n * tp) * 8 / (p["eta"] * bps)
    t += (n - 1) / n * tp * 8 / (p["eta_alltoall"] * bps)          # the two-phase transport's alltoall
    t += hops(method, ar, ag, n, tp) * p["alpha_s"]
    if fp16_transport(method):
        t += p["rho_fp16_s"] * 2 * (n - 1) / n * elements / min(share, 1.0)   # each worker sums 2(n-1)/n of them
    return t


def step_time(p: dict, method: str, n: int, bps: float, compute: float, codec: float, ar: float, ag: float,
              elements: float, tp: float = 0.0, share: float = 1.0) -> float:
    t_comm = comm_time(p, method, n, bps, ar, ag, tp, elements, share)
    if pipelined(method):
        return max(compute + codec, t_comm)
    return compute + codec + max(0.0, t_comm - p["omega"] * compute)


def _run(r: dict) -> tuple:
    """Which run a record belongs to: one hx-bench launch per worker count, bandwidth and setting."""
    return r["workers"], r["bandwidth"], r.get("setting")


def run_compute(records: list[dict]) -> dict:
    """Compute seconds per step for each run (workers, bandwidth, setting): the median of every compute-alone
    figure the run measured (at its start, and beside each method where hx-bench timed it). Compute does not
    depend on the method, and on a busy host one figure alone moves by tens of percent within a run."""
    groups: dict = {}
    for r in records:
        groups.setdefault(_run(r), []).append(r["compute_s"])
    return {k: statistics.median(v) for k, v in groups.items()}


def points(records: list[dict], cores: int = 2) -> list[dict]:
    """The measured points the model is checked on: every method record with a link rate (``cores``:
    the measuring host's, where a record does not say), each with its run's compute (:func:`run_compute`)."""
    out = []
    compute = run_compute(records)
    for r in records:
        if r["method"] == "compute_only" or not r.get("bandwidth_bps"):
            continue
        ar, ag, tp = payload(r)
        out.append({"method": r["method"], "workers": r["workers"], "bandwidth": r["bandwidth"],
                    "bps": r["bandwidth_bps"], "compute_s": compute[_run(r)],
                    "codec_s": r.get("codec_s") or 0.0,
                    "ar": ar, "ag": ag, "tp": tp, "elements": r["parameters"], "measured_s": r["median_step_s"],
                    "share": r.get("host_cores", cores) / r["workers"]})
    return out


def predicted(p: dict, pt: dict) -> float:
    return step_time(p, pt["method"], pt["workers"], pt["bps"], pt["compute_s"], pt["codec_s"], pt["ar"], pt["ag"],
                     pt["elements"], pt["tp"], pt.get("share", 1.0))


def fit(pts: list[dict]) -> dict:
    """Least-squares fit of the constants to the relative error of every point."""
    try:
        from scipy.optimize import least_squares
    except ImportError:
        sys.exit("hx-bench predict needs scipy (pip install scipy; `make setup` installs it)")
    names = [n for n, *_ in PARAMS]
    scale = [abs(v) or 1.0 for _, v, _, _ in PARAMS]

    def residuals(x):
        p = {k: v * s for k, v, s in zip(names, x, scale)}
        return [predicted(p, pt) / pt["measured_s"] - 1.0 for pt in pts]

    x0 = [1.0] * len(PARAMS)
    lo = [b / s for (_, _, b, _), s in zip(PARAMS, scale)]
    hi = [b / s for (_, _, _, b), s in zip(PARAMS, scale)]
    res = least_squares(residuals, x0, bounds=(lo, hi))
    return {k: float(v * s) for k, v, s in zip(names, res.x, scale)}


def check(p: dict, pts: list[dict]) -> list[dict]:
    rows = []
    for pt in pts:
        pred = predicted(p, pt)
        rows.append({"method": pt["method"], "workers": pt["workers"], "bandwidth": pt["bandwidth"],
                     "measured_s": pt["measured_s"], "predicted_s": pred,
                     "error": pred / pt["measured_s"] - 1.0})
    return rows


# ---- predictions ---------------------------------------------------------------------------------------
#: (method, payload bytes per gradient element, transport: "allreduce" | "allgather" | "two-phase",
#: Global-QSGD bits or None); PowerSGD's payload comes from the measured runs
PREDICT_METHODS = (
    ("hvd_fp32", 4.0, "allreduce", None), ("hvd_fp16", 2.0, "allreduce", None), ("hx_bf16", 2.0, "two-phase", None),
    ("hx_global_qsgd8", 1.0, "allreduce", 8), ("hx_global_qsgd8+pipe", 1.0, "allreduce", 8),
    ("hx_global_qsgd4", 0.5, "allreduce", 4), ("hx_topk0.01", 0.08, "allgather", None),
    ("hx_random_block0.01", 0.04, "allreduce", None), ("hx_powersgd4", None, "allreduce", None),
    ("hx_powersgd4+pipe", None, "allreduce", None),
)


def predict_table(p: dict, params: float, compute_s: float, codec_s_per_element: dict, powersgd_bytes: float,
                  workers=(2, 8, 32, 128, 512, 1024), gbps=(10, 25, 100), gpu: bool = False) -> list[dict]:
    """Scaling efficiency C / step per method, worker count and link rate. ``gpu``: NCCL sums float16
    natively (rho = 0)."""
    q = dict(p, rho_fp16_s=0.0) if gpu else p
    rows = []
    for method, per_el, transport, bits in PREDICT_METHODS:
        nbytes = powersgd_bytes if per_el is None else per_el * params
        ar = nbytes if transport == "allreduce" else 0.0
        ag = nbytes if transport == "allgather" else 0.0
        tp = nbytes if transport == "two-phase" else 0.0
        codec = codec_s_per_element.get(method.split("+")[0], 0.0) * params
        for g in gbps:
            row = {"method": method, "gbps": g, "efficiency": {}}
            for n in workers:
                if bits is not None and n > (1 << (bits - 1)) - 1:
                    row["efficiency"][n] = None          # lanes too narrow for n workers
                    continue
                step = step_time(q, method, n, g * 1e9, compute_s, codec, ar, ag, params, tp)
                row["efficiency"][n] = compute_s / step
            rows.append(row)
    return rows


def hierarchical_table(p: dict, params: float, compute_s: float, codec_s: float, node_size: int, node_gbps: float,
                       workers=(8, 32, 128, 512, 1024), gbps=(10, 25, 100), bits: int = 8) -> list[dict]:
    """A design on paper, not implemented: fp32 inside a node, Global-QSGD between nodes. Per step,
    a reduce-scatter of the fp32 gradient over the node's ``node_size`` workers (links of
    ``node_gbps``), a ring allreduce across the n / node_size nodes of each worker's 1/node_size shard
    quantized to ``bits`` bits (on the inter-node links, one per worker), an allgather inside the
    node; pipelined like ``+pipe``. The lanes must hold the node count, not the worker count. Rows:
    the hierarchical design and, for comparison, flat Global-QSGD and flat fp32 on the same links."""
    q = dict(p, rho_fp16_s=0.0)
    rows = []
    for g in gbps:
        row = {"method": f"hier fp32 x{node_size} + qsgd{bits}", "gbps": g, "efficiency": {}}
        for n in workers:
            nodes = max(n // node_size, 1)
            if nodes > (1 << (bits - 1)) - 1:
                row["efficiency"][n] = None
                continue
            inside = 2 * (node_size - 1) / node_size * 4 * params * 8 / (q["eta"] * node_gbps * 1e9)
            inside += 2 * (node_size - 1) * q["alpha_s"]
            shard = params / node_size * bits / 8
            across = wire_bytes(shard, 0.0, nodes) * 8 / (q["eta"] * g * 1e9) + 2 * 2 * (nodes - 1) * q["alpha_s"]
            step = max(compute_s + codec_s / node_size, inside + across)
            row["efficiency"][n] = compute_s / step
        rows.append(row)
    return rows


def codec_costs(records: list[dict]) -> dict:
    """Codec seconds per gradient element, per codec (the median over the measured 2-worker points)."""
    per = {}
    for r in records:
        if r["method"].startswith("hx_") and r["workers"] == 2 and r.get("codec_s") is not None:
            per.setdefault(r["method"].split("+")[0], []).append(r["codec_s"] / r["parameters"])
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def powersgd_payload(records: list[dict]) -> float | None:
    for r in records:
        if r["method"].startswith("hx_powersgd"):
            return payload(r)[0]
    return None


def format_check(rows: list[dict]) -> str:
    lines = ["| method | workers | link | measured s | predicted s | error |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["method"], r["workers"], r["bandwidth"])):
        lines.append(f"| {r['method']} | {r['workers']} | {r['bandwidth']} | {r['measured_s']:.3f} | "
                     f"{r['predicted_s']:.3f} | {100 * r['error']:+.1f}% |")
    return "\n".join(lines)


def format_predictions(rows: list[dict]) -> str:
    workers = list(rows[0]["efficiency"]) if rows else []
    lines = ["| method | link | " + " | ".join(f"n={n}" for n in workers) + " |",
             "|---|---|" + "---|" * len(workers)]
    for r in rows:
        cells = ["lanes" if v is None else f"{100 * v:.0f}%" for v in r["efficiency"].values()]
        lines.append(f"| {r['method']} | {r['gbps']} Gbit/s | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    links = sorted({r["gbps"] for r in rows})
    fig, axes = plt.subplots(1, len(links), figsize=(5 * len(links), 4), sharey=True)
    axes = [axes] if len(links) == 1 else axes
    for ax, g in zip(axes, links):
        for r in (r for r in rows if r["gbps"] == g):
            xs = [n for n, v in r["efficiency"].items() if v is not None]
            ax.plot(xs, [100 * r["efficiency"][n] for n in xs], marker="o", label=r["method"])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{g} Gbit/s")
        ax.set_xlabel("workers")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("scaling efficiency, % (compute / step)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
               title="a line ends where Global-QSGD's lanes run out", title_fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hx-bench predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="hx-bench JSON files (best made with --no-adaptive: each codec's own speed)")
    p.add_argument("--params", type=float, default=None,
                   help="model size for the predictions (default: the measured model's)")
    p.add_argument("--compute-s", type=float, default=None,
                   help="compute seconds per step for the predictions (default: the measured 2-worker compute)")
    p.add_argument("--codec-scale", type=float, default=1.0,
                   help="multiply the measured codec seconds per element (e.g. for a faster device)")
    p.add_argument("--gpu", action="store_true", help="predict for NCCL: float16 sums cost nothing extra")
    p.add_argument("--cores", type=int, default=os.cpu_count(),
                   help="cores of the host the runs were measured on, where a run does not record it (default: this host's)")
    p.add_argument("--alpha-us", type=float, default=None,
                   help="latency per ring hop for the predictions, microseconds (default: the fitted value, which on "
                        "an oversubscribed host also absorbs CPU contention)")
    p.add_argument("--node-size", type=int, default=8,
                   help="workers per node for the hierarchical design on paper (default 8; 0: leave it out)")
    p.add_argument("--node-gbps", type=float, default=2400.0,
                   help="link rate inside a node for the hierarchical design, Gbit/s (default 2400, NVLink-class)")
    p.add_argument("--label", default="", help="title of the prediction table and plot")
    p.add_argument("--json", default="out/hx-bench-predict.json", help="output JSON")
    p.add_argument("--plot", default=None, help="output PNG (default: the JSON path with .png)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    records = []
    for path in args.runs:
        with open(path) as f:
            records += json.load(f)["records"]
    pts = points(records, args.cores)
    if not pts:
        print("hx-bench predict: no measured points with a link rate in the given runs", file=sys.stderr)
        return 2
    p = fit(pts)
    rows = check(p, pts)
    worst = max(rows, key=lambda r: abs(r["error"]))
    print("fitted: " + ", ".join(f"{k}={v:.4g}" for k, v in p.items()))
    print(format_check(rows))
    print(f"worst: {100 * worst['error']:+.1f}% ({worst['method']}, {worst['workers']} workers, {worst['bandwidth']}); "
          f"mean |error| {100 * sum(abs(r['error']) for r in rows) / len(rows):.1f}% over {len(rows)} points")
    two = [r for r in records if r["method"] == "compute_only" and r["workers"] == 2]
    params = args.params or records[0]["parameters"]
    compute = args.compute_s or (two[0]["compute_s"] if two else pts[0]["compute_s"])
    costs = {k: v * args.codec_scale for k, v in codec_costs(records).items()}
    psgd = powersgd_payload(records) or 0.0
    psgd *= params / records[0]["parameters"]
    pp = dict(p, alpha_s=args.alpha_us * 1e-6) if args.alpha_us is not None else p
    pred = predict_table(pp, params, compute, costs, psgd, gpu=args.gpu)
    label = args.label or f"{params / 1e6:.1f}M parameters, compute {compute:.3f} s/step"
    print(f"\nscaling efficiency (compute / step), {label}:")
    print(format_predictions(pred))
    hier = []
    if args.node_size > 1:
        hier = hierarchical_table(pp, params, compute, costs.get("hx_global_qsgd8", 0.0) * params, args.node_size,
                                  args.node_gbps)
        print(f"\nhierarchical design on paper (fp32 inside nodes of {args.node_size} at {args.node_gbps:g} Gbit/s, "
              f"Global-QSGD 8-bit between nodes, pipelined):")
        print(format_predictions(hier))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"command": "hx-bench predict " + " ".join(sys.argv[1:] if argv is None else argv),
                   "fitted": p, "check": rows, "worst_error": worst["error"], "params": params,
                   "compute_s": compute, "codec_s_per_element": costs, "gpu": args.gpu,
                   "prediction_constants": pp,
                   "predictions": [dict(r, efficiency={str(k): v for k, v in r["efficiency"].items()}) for r in pred],
                   "hierarchical": [dict(r, efficiency={str(k): v for k, v in r["efficiency"].items()}) for r in hier],
                   "node_size": args.node_size, "node_gbps": args.node_gbps},
                  f, indent=1)
    plot(pred, args.plot or os.path.splitext(args.json)[0] + ".png", label)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
