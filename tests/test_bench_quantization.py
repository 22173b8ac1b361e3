"""`python -m bench.quantization --quick` end to end, on the stand-in model (no wheel needed).

The benchmark drives `model quantize` and `model compare`'s own code; this smoke run keeps
it working when they change. Its figures mean nothing (a smoke run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import quantization


def test_the_quick_run_goes_through_every_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quantization, "find_ppocr", lambda *_: (None, "not used in tests"))
    monkeypatch.setattr(quantization, "BENCH_DIR", tmp_path / "bench")
    out = tmp_path / "report.json"

    code = quantization.main(["--quick", "--cases", "cls", "--json", str(out)])

    assert code == 0
    document = json.loads(out.read_text())
    assert document["benchmark"] == "quantization"
    (case,) = document["results"]["cases"]
    assert case["name"].startswith("mid-size CNN (stand-in")
    variants = {v["name"]: v for v in case["variants"]}
    assert list(variants) == ["static", "perchannel", "auto", "dynamic"]
    assert all(v["error"] is None and v["comparison"] for v in variants.values())
    assert variants["auto"]["report"]["auto_exclude"]["reached"] is True
    assert variants["perchannel"]["report"]["settings"]["per_channel"] is True
    # Every model timed at both thread counts, FP32 first; ratios against it.
    assert set(case["latency_ms"]) == {"FP32", *variants}
    assert all(set(t) == {"1", "2"} for t in case["latency_ms"].values())
    assert set(case["ratio_p50"]) == set(variants)
    names = [f["name"] for f in document["figures"]]
    assert "cls INT8 static: P50 latency, 1 thread" in names
    assert not (tmp_path / "bench" / "quantization").exists()  # scratch removed
