"""Issue 18: hx-bench predict's cost model (fit, per-point check, predictions, lane limit)."""
import json

import pytest

from horovod_ext.bench import predict as P

TRUE = {"eta": 0.7, "eta_alltoall": 0.4, "alpha_s": 2e-4, "rho_fp16_s": 2e-8, "omega": 0.6}


def synthetic_records():
    """hx-bench-shaped records whose step times follow the model exactly under TRUE."""
    recs = []
    params = 1_000_000
    for n in (2, 3, 4):
        compute = 0.1 * n / 2
        recs.append({"method": "compute_only", "workers": n, "bandwidth": "x", "bandwidth_bps": 1e9,
                     "compute_s": compute, "parameters": params, "median_step_s": compute})
        for bw, bps in (("100mbit", 1e8), ("1gbit", 1e9), ("10gbit", 1e10)):
            for method, ar, ag, a2a, codec in (("hvd_fp32", 4e6, 0, 0, 0.0), ("hvd_fp16", 2e6, 0, 0, 0.0),
                                               ("hx_global_qsgd8", 1e6, 0, 0, 0.01),
                                               ("hx_global_qsgd8+pipe", 1e6, 0, 0, 0.012),
                                               ("hx_topk0.01", 0, 8e4, 0, 0.02),
                                               ("hx_bf16", 0, 2e6 / n, 2e6 * (n - 1) / n, 0.004)):
                rec = {"method": method, "workers": n, "bandwidth": bw, "bandwidth_bps": bps, "compute_s": compute,
                       "host_cores": 64,
                       "parameters": params, "codec_s": codec, "bytes_allreduce_per_step": ar,
                       "bytes_allgather_per_step": ag, "bytes_alltoall_per_step": a2a}
                a, g, tp = P.payload(rec)
                rec["median_step_s"] = P.step_time(TRUE, method, n, bps, compute, codec, a, g, params, tp)
                recs.append(rec)
    return recs


def test_fit_recovers_the_constants_and_checks_every_point():
    pts = P.points(synthetic_records())
    assert len(pts) == 3 * 3 * 6
    fitted = P.fit(pts)
    rows = P.check(fitted, pts)
    assert max(abs(r["error"]) for r in rows) < 1e-3
    assert fitted["eta"] == pytest.approx(TRUE["eta"], rel=1e-2)
    assert fitted["eta_alltoall"] == pytest.approx(TRUE["eta_alltoall"], rel=2e-2)
    assert fitted["rho_fp16_s"] == pytest.approx(TRUE["rho_fp16_s"], rel=5e-2)


def test_wire_bytes_follow_each_collective():
    assert P.wire_bytes(100.0, 0.0, 2) == 100.0 and P.wire_bytes(100.0, 0.0, 4) == 150.0
    assert P.wire_bytes(0.0, 10.0, 5) == 40.0                   # allgather: (n-1) payloads
    bf16 = {"workers": 4, "bytes_allreduce_per_step": 0, "bytes_alltoall_per_step": 75.0,
            "bytes_allgather_per_step": 25.0}
    assert P.payload(bf16) == (0.0, 0.0, 100.0)                  # the full bf16 payload, two-phase
    assert P.wire_bytes(0.0, 0.0, 4, 100.0) == 150.0             # alltoall 3/4 + allgather 3/4
    assert P.hops("hx_global_qsgd8", 1.0, 0.0, 4) == 12 and P.hops("hvd_fp32", 1.0, 0.0, 4) == 6


def test_pipelining_hides_communication_up_to_the_compute():
    p = dict(TRUE, alpha_s=0.0)
    # 1 MB at 1 Gbit/s and eta 0.7: 11.4 ms of wire, under 100 ms of compute
    assert P.step_time(p, "hx_x+pipe", 2, 1e9, 0.1, 0.0, 1e6, 0.0, 1) == pytest.approx(0.1)
    assert P.step_time(p, "hx_x+pipe", 2, 1e7, 0.1, 0.0, 1e6, 0.0, 1) == pytest.approx(8e6 / (0.7 * 1e7))


def test_predictions_mark_where_global_qsgd_lanes_run_out(tmp_path):
    rows = P.predict_table(TRUE, 22e6, 0.3, {"hx_global_qsgd8": 1e-9}, 1e6, workers=(2, 127, 128, 1024), gbps=(10,))
    q8 = next(r for r in rows if r["method"] == "hx_global_qsgd8")
    assert q8["efficiency"][128] is None and q8["efficiency"][1024] is None and q8["efficiency"][127] > 0
    fp32 = next(r for r in rows if r["method"] == "hvd_fp32")
    assert fp32["efficiency"][2] > fp32["efficiency"][1024] > 0
    runs = tmp_path / "run.json"
    runs.write_text(json.dumps({"records": synthetic_records()}))
    out = tmp_path / "predict.json"
    assert P.main([str(runs), "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert abs(saved["worst_error"]) < 1e-3 and (tmp_path / "predict.png").exists()


def test_hierarchical_design_counts_nodes_against_the_lanes():
    rows = P.hierarchical_table(TRUE, 22e6, 0.3, 0.01, node_size=8, node_gbps=2400, workers=(8, 1016, 1024), gbps=(25,))
    eff = rows[0]["efficiency"]
    assert eff[8] > 0 and eff[1016] > 0 and eff[1024] is None     # 127 nodes fit 8-bit lanes, 128 do not


def test_oversubscribed_workers_slow_the_float16_sum():
    p = dict(TRUE, alpha_s=0.0)
    full = P.comm_time(p, "hvd_fp16", 4, 1e12, 2e6, 0.0, 0.0, 1e6, share=1.0)
    half = P.comm_time(p, "hvd_fp16", 4, 1e12, 2e6, 0.0, 0.0, 1e6, share=0.5)
    wire = P.comm_time(p, "hvd_fp32", 4, 1e12, 2e6, 0.0, 0.0, 1e6, share=0.5)
    assert half - wire == pytest.approx(2 * (full - wire))


def test_hx_bench_measures_compute_beside_each_method(tmp_path):
    """hx-bench's step benchmark, really launched (2 Horovod workers on localhost): every method's record
    carries the compute time measured beside it, and our codecs' limit is max(that compute, wire time)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    proc = subprocess.run([str(Path(sys.executable).parent / "hx-bench"), "--no-netns", "--workers", "2",
                           "--model", "small", "--steps", "2", "--warmup", "1",
                           "--methods", "hvd_fp32,hx_global_qsgd8", "--json", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    recs = {r["method"]: r for r in json.loads(out.read_text())["records"]}
    assert set(recs) == {"compute_only", "hvd_fp32", "hx_global_qsgd8"}
    for method in ("hvd_fp32", "hx_global_qsgd8"):
        r = recs[method]
        assert r["compute_s"] > 0 and r["compute_first_s"] == recs["compute_only"]["compute_s"]
        assert r["exposed_comm_s"] == pytest.approx(max(r["median_step_s"] - r["compute_s"], 0.0))
    q = recs["hx_global_qsgd8"]
    assert q["limit_s"] == pytest.approx(max(q["compute_s"], q["wire_s"]))
    assert "compute beside s" in proc.stdout


def test_each_point_takes_the_median_compute_of_its_run():
    """Compute alone does not depend on the method: a point's compute is the median of every figure its run
    measured (the start-of-run one and those beside each method), so one slow measurement does not move it."""
    base = {"workers": 2, "bandwidth": "1gbit", "bandwidth_bps": 1e9, "parameters": 1000, "setting": "comm-bound"}
    recs = [dict(base, method="compute_only", compute_s=0.10, median_step_s=0.10),
            dict(base, method="hvd_fp32", compute_s=0.30, median_step_s=0.5, bytes_allreduce_per_step=4000.0),
            dict(base, method="hx_global_qsgd8", compute_s=0.12, median_step_s=0.2, bytes_allreduce_per_step=1000.0),
            dict(base, method="hvd_fp32", compute_s=0.90, median_step_s=0.9, bandwidth="10gbit", bandwidth_bps=1e10,
                 bytes_allreduce_per_step=4000.0)]
    pts = P.points(recs)
    assert [p["compute_s"] for p in pts] == [0.12, 0.12, 0.90]
