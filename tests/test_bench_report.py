"""bench/report.py (``make bench``): rows recorded by benchmarks become docs/performance.md's tables and the ratio
chart.  Fed with small hand-made records and a fake benchmark script; no real benchmark runs here."""

import importlib.util
import json
import os
import struct
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = load("report")
timing = load("timing")


def row(bench, case, impl, seconds, ours=False, best=None, note=None, cpu=None):
    return {"benchmark": bench, "case": case, "impl": impl, "seconds": seconds, "ours": ours, "best": best,
            "cpu": cpu, "note": note}


RECORDS = [row("ctc", "ctc_loss T=20", "ptnative.ctc_loss", 0.010, True, 0.009),
           row("ctc", "ctc_loss T=20", "torch ctc_loss", 0.005, best=0.004),
           row("ctc", "ctc_loss T=20", "pytensor.scan CTC", 0.300),
           row("ctc", "ctc_loss T=20", "torchaudio", None, note="not installed"),
           row("lstm", "LSTM T=10", "ptnative native2", 0.1, True),
           row("lstm", "LSTM T=10", "ptnative lowmem", 0.2, True),
           row("lstm", "LSTM T=10", "torch.nn.LSTM", 0.08)]


def run(bench, status="ok", seconds=10.0, other=0.0, tail="", alternating=True, returncode=0):
    return {"benchmark": bench, "command": f"python bench/{bench}.py", "alternating": alternating, "status": status,
            "returncode": returncode, "seconds": seconds, "other_cores": other, "output_tail": tail}


RUNS = [run("ctc", seconds=12.0, other=1.0, alternating=False), run("lstm", seconds=30.0, other=0.5),
        run("hmm_pymc", status="not run", seconds=0.0, other=None, tail="pymc not installed"),
        run("sparse", status="failed", seconds=3.0, tail="Traceback\nValueError: boom", returncode=1)]
META = {"date": "2026-12-01 18:00 UTC", "quick": True, "note": "a test run",
        "machine": {"cpu": "Test CPU 9000", "cores": 2, "usable_cores": 2, "memory_gib": 8.0, "os": "Linux 6",
                    "load_average": [1.5, 1.0, 1.0], "threads_env": {}},
        "versions": {"python": "3.11.7", "torch": None, "numpy": "2.4.6"}}


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_record_writes_rows_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(timing.RECORDS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    timing.record("ctc", "case", "ptnative", 0.5, ours=True)
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "rows.jsonl"
    monkeypatch.setenv(timing.RECORDS_ENV, str(path))
    timing.record("ctc", "case", "ptnative", 0.5, ours=True, best=0.25)
    timing.record("ctc", "case", "torch", None, note="not installed")
    timing.record("ctc", "case", "peer", 0.75, cpu=1.5)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [row("ctc", "case", "ptnative", 0.5, True, 0.25), row("ctc", "case", "torch", None,
                                                                         note="not installed"),
                    row("ctc", "case", "peer", 0.75, cpu=1.5)]


def test_tables_summary_and_chart(tmp_path):
    md, png = tmp_path / "performance.md", tmp_path / "img" / "performance.png"
    text = report.write_report(RECORDS, RUNS, META, md, png)
    assert md.read_text() == text
    lines = text.splitlines()
    # ctc: ratios are each row's median over the case's first ptnative row; peers get a verdict
    assert "| ctc_loss T=20 | **ptnative.ctc_loss** | 10 ms | 9 ms | reference |  |" in lines
    assert "|  | torch ctc_loss | 5 ms | 4 ms | 0.5 | ptnative 2x slower |" in lines
    assert "|  | pytensor.scan CTC | 300 ms | - | 30 | ptnative 30x faster |" in lines
    assert "|  | torchaudio | not installed | - |  |  |" in lines
    # a second ptnative row is compared with the first, without a verdict
    assert "|  | **ptnative lowmem** | 200 ms | - | 2 |  |" in lines
    assert "|  | torch.nn.LSTM | 80 ms | - | 0.8 | ptnative 1.25x slower |" in lines
    # summary: ctc has two peer comparisons (0.5 and 30: geometric mean 3.87), one of them ptnative's
    assert "| [ctc](#ctc) | 2 | 1 | 3.87 | 0.5 – 30 |" in lines
    assert "| [lstm](#lstm) | 1 | 0 | 0.8 | 0.8 – 0.8 |" in lines
    assert "Not run: pymc not installed." in lines
    assert "**Failed** (exit status 1, 3 s, other processes busy on 0.00 cores on average); the end of its output:" \
        in lines
    assert "ValueError: boom" in lines
    assert "Ran in 12 s, other processes busy on 1.00 cores on average. Each implementation was timed after the " \
        "other (not in alternating turns)." in lines
    assert "Ran in 30 s, other processes busy on 0.50 cores on average. ptnative and its peers were timed in " \
        "alternating turns (`timing.measure_interleaved`)." in lines
    assert "- CPU: Test CPU 9000, 2 logical cores, 8.0 GiB memory" in lines
    assert "| torch | not installed |" in lines
    assert "a test run" in lines
    # run-time weighted other load: (12 * 1.0 + 30 * 0.5 + 3 * 0) / 45 = 0.6 cores
    assert "**Measured under load**: other processes kept on average 0.60 of the 2 cores busy" in text
    if importlib.util.find_spec("matplotlib") is None:
        assert "(No chart: matplotlib is not installed.)" in lines
        return
    assert "![peer time / ptnative time per comparison](img/performance.png)" in lines
    width, height = png_size(png)
    assert width > 600 and height > 100


def test_chart_bars(tmp_path):
    pytest.importorskip("matplotlib")
    bars = report.draw_chart(RECORDS, tmp_path / "chart.png")
    assert [label for label, _ in bars] == ["ctc_loss T=20 vs torch ctc_loss", "ctc_loss T=20 vs pytensor.scan CTC",
                                            "LSTM T=10 vs torch.nn.LSTM"]
    assert [ratio for _, ratio in bars] == pytest.approx([0.5, 30.0, 0.8])
    with pytest.raises(ValueError, match="no peer was measured"):
        report.draw_chart([r for r in RECORDS if r["ours"]], tmp_path / "none.png")


def test_without_matplotlib_the_page_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    md, png = tmp_path / "performance.md", tmp_path / "img" / "performance.png"
    text = report.write_report(RECORDS, RUNS, META, md, png)
    assert "(No chart: matplotlib is not installed.)" in text.splitlines()
    assert "|  | torch ctc_loss | 5 ms | 4 ms | 0.5 | ptnative 2x slower |" in text.splitlines()
    assert not png.exists()


def test_runs_a_benchmark_script_and_writes_the_page(tmp_path):
    """A fake benchmark records rows through timing.record in a child process; one that fails and one that needs a
    missing package are listed as such; --from-records writes the page from the kept file."""
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BENCH)!r})
        from timing import record
        print("timing things", sys.argv[1:])
        record("good", "case A", "ptnative", 0.002, ours=True)
        record("good", "case A", "peer", 0.006)
    """))
    bad.write_text("print('about to fail')\nraise SystemExit(3)\n")
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"meta": META}) + "\n")
    runs = [report.run_benchmark(report.Benchmark("good", ("--quick-flag",)), True, records, script=good),
            report.run_benchmark(report.Benchmark("bad"), True, records, script=bad),
            report.run_benchmark(report.Benchmark("needy", requires=("no_such_package_for_ptnative",)), True,
                                 records)]
    with open(records, "a") as f:
        for r in runs:
            f.write(json.dumps({"run": r}) + "\n")
    assert [r["status"] for r in runs] == ["ok", "failed", "not run"]
    assert runs[0]["command"] == "python bench/good.py --quick-flag"
    assert runs[0]["alternating"] is False  # it calls no alternating-turns function of timing.py
    assert report.alternates(BENCH / "lstm.py") and report.alternates(BENCH / "sparse.py")
    assert "timing things ['--quick-flag']" in runs[0]["output_tail"]
    assert runs[1]["returncode"] == 3 and runs[1]["output_tail"] == "about to fail"
    assert runs[2]["output_tail"] == "no_such_package_for_ptnative not installed"
    rows, read_runs, meta = report.read_records(records)
    assert rows == [row("good", "case A", "ptnative", 0.002, True), row("good", "case A", "peer", 0.006)]
    assert read_runs == runs and meta == META

    out = tmp_path / "docs" / "performance.md"
    status = report.main(["--from-records", str(records), "--out", str(out)])
    assert status == 1  # a benchmark failed
    lines = out.read_text().splitlines()
    assert "| case A | **ptnative** | 2 ms | - | reference |  |" in lines
    assert "|  | peer | 6 ms | - | 3 | ptnative 3x faster |" in lines
    assert "Not run: no_such_package_for_ptnative not installed." in lines
    assert os.path.exists(tmp_path / "docs" / "img" / "performance.png") == (
        importlib.util.find_spec("matplotlib") is not None)


def test_merge_takes_each_benchmark_from_the_last_file():
    lstm_again = [row("lstm", "LSTM T=10", "ptnative native2", 0.05, True), row("lstm", "LSTM T=10", "torch.nn.LSTM",
                                                                                0.1)]
    first = (RECORDS, RUNS[:2], dict(META, date="d1"))
    second = (lstm_again, [run("lstm", seconds=5.0)], dict(META, date="d2", note="re-run"))
    records, runs, meta = report.merge_records([first, second])
    assert [(r["benchmark"], r["seconds"]) for r in runs] == [("ctc", 12.0), ("lstm", 5.0)]
    assert [r for r in records if r["benchmark"] == "lstm"] == lstm_again
    assert [r for r in records if r["benchmark"] == "ctc"] == RECORDS[:4]
    assert meta["date"] == "d1 and d2" and meta["note"] == "a test run; re-run"
    assert "|  | torch.nn.LSTM | 100 ms | - | 2 | ptnative 2x faster |" in report.render(
        records, runs, meta, "p.png", None).splitlines()


def test_measure_against_times_in_turns_and_records(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    monkeypatch.setenv(timing.RECORDS_ENV, str(path))
    monkeypatch.setattr(timing, "WARM_SECONDS", 0.0)
    monkeypatch.setattr(timing, "BATCH_SECONDS", 0.0)  # one call per timing
    calls = []
    timings = timing.measure_against("demo", "case", lambda: calls.append("ours") or 1,
                                     {"peer": lambda: calls.append("peer") or 2}, reps=4, rounds=2)
    assert timings["ptnative"].result == 1 and timings["peer"].result == 2
    # two rounds, each: one warm-up call and two timed calls of ptnative, then the same of the peer
    assert calls == ["ours"] * 3 + ["peer"] * 3 + ["ours"] * 3 + ["peer"] * 3
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["benchmark"], r["case"], r["impl"], r["ours"]) for r in rows] == [("demo", "case", "ptnative", True),
                                                                                 ("demo", "case", "peer", False)]
    assert rows[0]["seconds"] == timings["ptnative"].median and rows[1]["best"] == timings["peer"].best


def test_short_calls_are_timed_in_batches(monkeypatch):
    """A function whose warm-up calls are short is timed in batches of about BATCH_SECONDS; each timing is the
    batch's time per call.  A slow one keeps one call per timing."""
    monkeypatch.setattr(timing, "WARM_SECONDS", 0.005)
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        timing.time.sleep(0.004)

    t = timing.measure_interleaved({"fast": fast, "slow": slow}, reps=3, rounds=1, settle=0.001, warmup=1)
    # the warm-up until WARM_SECONDS (two calls; one when a loaded machine stretches the first sleep past it), then
    # one call per timing
    assert calls["slow"] in (1 + 3, 2 + 3)
    assert calls["fast"] > 100 * 3 and t["fast"].median < 1e-4 and t["fast"].best <= t["fast"].median
    assert 0.004 <= t["slow"].best <= t["slow"].median


def test_each_turn_warms_up_for_warm_seconds_after_its_pause(monkeypatch):
    monkeypatch.setattr(timing, "WARM_SECONDS", 0.01)
    real_sleep, pause_ends = timing.time.sleep, []

    def sleep(seconds):
        real_sleep(seconds)
        pause_ends.append(timing.time.perf_counter())

    monkeypatch.setattr(timing.time, "sleep", sleep)
    stamps = {"a": [], "b": []}
    timing.measure_interleaved({name: (lambda name=name: stamps[name].append(timing.time.perf_counter()))
                                for name in stamps}, reps=4, rounds=2, settle=0.05, warmup=1)
    assert len(pause_ends) == 4  # rounds x functions, in the order a, b, a, b
    for i, (name, times) in enumerate(stamps.items()):
        # two turns (split at the pause), each: untimed calls until WARM_SECONDS after the pause, then two timed
        # calls (the first of them starts no earlier than that, however the machine schedules the calls)
        gaps = [later - earlier for earlier, later in zip(times, times[1:])]
        cut = 1 + gaps.index(max(gaps))
        for turn, pause_end in zip((times[:cut], times[cut:]), pause_ends[i::2]):
            assert len(turn) > 3 and turn[0] >= pause_end, name
            assert turn[-2] - pause_end >= 0.01 and turn[-3] - pause_end < 0.05, name


def test_cpu_column_where_measured():
    rows = [row("rnnt", "case", "ptnative", 0.010, True, cpu=0.004), row("rnnt", "case", "numpy", 0.5)]
    lines = report.benchmark_table(report.cases(rows)["rnnt"]).splitlines()
    assert lines[0] == "| case | implementation | median | best | CPU | time / ptnative | |"
    assert lines[2:] == ["| case | **ptnative** | 10 ms | - | 4 ms | reference |  |",
                         "|  | numpy | 500 ms | - | - | 50 | ptnative 50x faster |"]


def test_ratios_by_fastest_call():
    """--ratio-by best: the ratios divide fastest calls (a row without one keeps its median)."""
    meta = dict(META, ratio_by="best")
    lines = report.render(RECORDS, RUNS, meta, "p.png", None).splitlines()
    assert "|  | torch ctc_loss | 5 ms | 4 ms | 0.444 | ptnative 2.25x slower |" in lines  # 4 ms / 9 ms
    assert "|  | pytensor.scan CTC | 300 ms | - | 33 | ptnative 33x faster |" in lines  # 300 ms / 9 ms
    assert [round(r, 3) for *_, r in report.comparisons(RECORDS, "best")] == [0.444, 33.333, 0.8]


def test_a_peer_compared_with_the_ptnative_row_called_like_it(tmp_path, monkeypatch):
    """``record(..., versus=...)``: a peer's verdict and the summary's ratio use the named ptnative row; the ratio
    column stays against the reference; an unknown name falls back to the reference."""
    path = tmp_path / "rows.jsonl"
    monkeypatch.setenv(timing.RECORDS_ENV, str(path))
    timing.record("hmm", "case", "ptnative", 0.010, ours=True)
    timing.record("hmm", "case", "ptnative eager", 0.004, ours=True)
    timing.record("hmm", "case", "hmmlearn", 0.008, versus="ptnative eager")
    timing.record("hmm", "case", "dynamax", 0.020)
    timing.record("hmm", "case", "other", 0.020, versus="ptnative no such row")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[2]["versus"] == "ptnative eager" and "versus" not in rows[3]
    lines = report.benchmark_table(report.cases(rows)["hmm"]).splitlines()
    assert "|  | hmmlearn | 8 ms | - | 0.8 | against ptnative eager: ptnative 2x faster |" in lines
    assert "|  | dynamax | 20 ms | - | 2 | ptnative 2x faster |" in lines
    assert "|  | other | 20 ms | - | 2 | ptnative 2x faster |" in lines
    assert [(impl, round(r, 3)) for _, _, impl, r in report.comparisons(rows)] == [
        ("hmmlearn", 2.0), ("dynamax", 2.0), ("other", 2.0)]
