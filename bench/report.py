"""``make bench``: run every benchmark in bench/, collect the rows they record, and write docs/performance.md (a
table per benchmark: ptnative against each peer, times and ratios, with the machine and the versions) and
docs/img/performance.png (a chart of the ratios).

    python bench/report.py [--quick] [--only ctc,lstm] [--note TEXT] [--keep-records FILE]
    python bench/report.py --from-records FILE...   (re-write the page from kept runs, measuring nothing)

Each benchmark runs as its own process (``python bench/<name>.py``, with shorter settings under ``--quick``) and
appends its rows through ``timing.record`` to the JSON-lines file named by ``PTNATIVE_BENCH_RECORDS``.  A peer
that is not installed is a row saying so; a benchmark whose required package is missing is listed as not run; a
benchmark that exits with an error is listed as failed with the end of its output, and the report then exits
with status 1 after writing the page.  While the benchmarks run, the CPU time the rest of the machine used is
measured (/proc/stat minus this run's own processes) and stated in the page.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RECORDS_ENV = "PTNATIVE_BENCH_RECORDS"  # timing.RECORDS_ENV (not imported: timing needs numpy, this needs none)
NOT_BENCHMARKS = {"timing", "report", "gpu_profile"}  # helpers, and a profiler that prints kernel tables
PEER_PACKAGES = ["torch", "torchaudio", "jax", "jaxlib", "dynamax", "hmmlearn", "editdistance", "rapidfuzz",
                 "pymc", "pymc-extras", "nutpie", "matplotlib"]
CORE_PACKAGES = ["numpy", "scipy", "pytensor", "numba"]
OTHER_LOAD_NOTED = 0.25  # cores of other work, on average, above which the page says it was measured under load


TURNS = {True: " ptnative and its peers were timed in alternating turns (`timing.measure_interleaved`).",
         False: " Each implementation was timed after the other (not in alternating turns)."}
ALTERNATING_CALLS = ("measure_interleaved(", "measure_against(")  # bench/timing.py's functions that alternate


class Benchmark(NamedTuple):
    name: str
    quick_args: tuple = ()  # command-line arguments under --quick
    full_args: tuple = ()
    requires: tuple = ()  # packages without which the benchmark cannot run at all
    ratios: bool = True  # its rows of a case are comparable (False: unrelated measurements, no ratio column)


KNOWN = {b.name: b for b in [
    Benchmark("ctc", ("--quick",)),
    Benchmark("lstm", ("--reps", "5", "--no-memory", "--table-B", "1,16,64", "--table-n", "256,1024")),
    Benchmark("train_ctc", ("--reps", "6"), requires=("torch",)),
    Benchmark("hmm", ("--reps", "9")),
    Benchmark("hmm_pymc", ("--steps", "500", "--reps", "60", "--no-sample"), requires=("pymc",)),
    Benchmark("rnnt", ("--reps", "3", "--no-reference")),
    Benchmark("edit_distance", ("--reps", "2")),
    Benchmark("chunking", ("--reps", "6")),
    Benchmark("sparse", ("--reps", "6")),
    Benchmark("jax_grad", ("--quick",), requires=("jax",)),
    Benchmark("cache_trust", ("--reps", "40"), ratios=False),
    Benchmark("gpu", ("--quick",)),
]}


def benchmarks(only=None):
    """Every benchmark script in bench/ (in KNOWN's order, then new ones by name), or those named in ``only``."""
    found = sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem not in NOT_BENCHMARKS and not p.stem[0] == "_")
    order = [n for n in KNOWN if n in found] + [n for n in found if n not in KNOWN]
    if only:
        unknown = [n for n in only if n not in found]
        if unknown:
            raise SystemExit(f"bench/report.py: no benchmark {unknown} in {BENCH_DIR} (have {order})")
        order = [n for n in order if n in only]
    return [KNOWN.get(n, Benchmark(n)) for n in order]


# ------------------------------------------------------------------ machine and versions
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info():
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "usable_cores": usable, "memory_gib": memory_gib(),
            "os": f"{platform.system()} {platform.release()}", "load_average": list(os.getloadavg()),
            "threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
                            if k in os.environ}}


def package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def ptnative_version():
    """(version, where it was imported from) as the benchmarks see it: run from bench/, with this PYTHONPATH."""
    code = "import ptnative, os; print(ptnative.__version__); print(os.path.dirname(ptnative.__file__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=BENCH_DIR)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "import failed"
    version, where = out.stdout.split("\n")[:2]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if Path(where).resolve().parent == ROOT and commit.returncode == 0:
        where = f"checkout {ROOT.name} at {commit.stdout.strip()}"
    return version, where


def versions():
    ours, where = ptnative_version()
    found = {"python": platform.python_version(), "ptnative": f"{ours} ({where})" if ours else f"not importable: "
             f"{where}"}
    for name in CORE_PACKAGES + PEER_PACKAGES:
        found[name] = package_version(name)
    return found


# ------------------------------------------------------------------ running
def busy_seconds():
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def alternates(script):
    """Whether a benchmark script times with bench/timing.py's alternating-turns functions (read, not run)."""
    try:
        text = Path(script).read_text(encoding="utf-8")
    except OSError:
        return None
    return any(call in text for call in ALTERNATING_CALLS)


def run_benchmark(bench, quick, records_path, timeout=None, script=None):
    """Run one benchmark script in a child process, its output passed through; returns its run summary."""
    script = Path(script or BENCH_DIR / f"{bench.name}.py")
    missing = [p for p in bench.requires if importlib.util.find_spec(p) is None]
    args = bench.quick_args if quick else bench.full_args
    command = ["python", f"bench/{script.name}", *args]
    run = {"benchmark": bench.name, "command": " ".join(command), "alternating": alternates(script), "status": "ok",
           "returncode": 0, "seconds": 0.0, "other_cores": None, "output_tail": ""}
    if missing:
        run.update(status="not run", output_tail=f"{', '.join(missing)} not installed")
        return run
    env = dict(os.environ, **{RECORDS_ENV: str(records_path)}, PYTHONUNBUFFERED="1")
    busy0, own0, t0 = busy_seconds(), children_seconds(), time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    killer = threading.Timer(timeout, proc.kill) if timeout else None
    if killer is not None:
        killer.start()
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line.rstrip("\n"))
    proc.wait()
    if killer is not None:
        killer.cancel()
        if proc.returncode == -9:
            lines.append(f"(killed after {timeout:g} s)")
    wall = time.perf_counter() - t0
    run["seconds"] = round(wall, 1)
    if busy0 is not None and wall > 0:
        other = (busy_seconds() - busy0) - (children_seconds() - own0)
        run["other_cores"] = round(max(other, 0.0) / wall, 2)
    run["returncode"] = proc.returncode
    run["output_tail"] = "\n".join(lines[-15:])
    if proc.returncode != 0:
        run["status"] = "failed"
    return run


def read_records(path):
    """(records, runs, meta) from a JSON-lines file written by the benchmarks and this script."""
    records, runs, meta = [], [], {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if "meta" in row:
                meta = row["meta"]
            elif "run" in row:
                runs.append(row["run"])
            else:
                records.append(row)
    return records, runs, meta


def merge_records(kept):
    """One (records, runs, meta) from several ``read_records`` results: each benchmark's rows and run from the last
    one that ran it (in the place where it first ran), the machine and versions of the last, the dates of all."""
    records, runs, metas = [], [], []
    for rows, file_runs, meta in kept:
        again = {r["benchmark"] for r in file_runs} | {r["benchmark"] for r in rows}
        records = [r for r in records if r["benchmark"] not in again] + rows
        for run in file_runs:
            same = [i for i, r in enumerate(runs) if r["benchmark"] == run["benchmark"]]
            if same:
                runs[same[0]] = run
            else:
                runs.append(run)
        metas.append(meta)
    unique = lambda values: list(dict.fromkeys(v for v in values if v))  # noqa: E731
    return records, runs, dict(metas[-1] if metas else {}, date=" and ".join(unique(m.get("date") for m in metas)),
                               note="; ".join(unique(m.get("note") for m in metas)),
                               quick=any(m.get("quick") for m in metas))


# ------------------------------------------------------------------ tables
def format_seconds(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 10:
        return f"{s * 1e3:.3g} ms" if s < 0.1 else f"{s * 1e3:.0f} ms"
    return f"{s:.1f} s"


def format_ratio(r):
    return "-" if r is None else f"{r:.3g}" if r < 10 else f"{r:.0f}"


def cases(records):
    """{benchmark: {case: [rows]}} in the order recorded."""
    out = {}
    for row in records:
        out.setdefault(row["benchmark"], {}).setdefault(row["case"], []).append(row)
    return out


def reference(rows):
    """The row the case's ratios divide by: its first measured ptnative row (None if there is none)."""
    return next((r for r in rows if r["ours"] and r["seconds"]), None)


def compared_with(row, rows):
    """The ptnative row a peer's ``row`` is compared with: the one its ``versus`` names, else the reference."""
    named = next((r for r in rows if r["ours"] and r["seconds"] and r["impl"] == row.get("versus")), None)
    return named or reference(rows)


def ratio_time(row, by):
    """The time a ratio uses: the median, or with ``by="best"`` the fastest call where it was measured."""
    return row["best"] if by == "best" and row.get("best") else row["seconds"]


def comparisons(records, by="median"):
    """[(benchmark, case, peer, ratio = peer time / ptnative time)] for every measured peer row."""
    out = []
    for bench, by_case in cases(records).items():
        for case, rows in by_case.items():
            for r in rows:
                versus = compared_with(r, rows)
                if versus is not None and not r["ours"] and r["seconds"]:
                    out.append((bench, case, r["impl"], ratio_time(r, by) / ratio_time(versus, by)))
    return out


def verdict(ratio):
    if ratio >= 1.05:
        return f"ptnative {ratio:.3g}x faster" if ratio < 10 else f"ptnative {ratio:.0f}x faster"
    if ratio <= 1 / 1.05:
        return f"ptnative {1 / ratio:.3g}x slower"
    return "about equal"


def md_escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def benchmark_table(rows_by_case, ratios=True, by="median"):
    """A benchmark's Markdown table; a CPU column where some row has a CPU time."""
    cpu = any(r.get("cpu") is not None for rows in rows_by_case.values() for r in rows)
    lines = [f"| case | implementation | median | best |{' CPU |' if cpu else ''} time / ptnative | |",
             f"|---|---|--:|--:|{'--:|' if cpu else ''}--:|---|"]
    for case, rows in rows_by_case.items():
        ref = reference(rows) if ratios else None
        for i, r in enumerate(rows):
            impl = f"**{md_escape(r['impl'])}**" if r["ours"] else md_escape(r["impl"])
            if r["seconds"] is None:
                time_cell, ratio_cell, remark = md_escape(r.get("note") or "not run"), "", ""
            else:
                time_cell = format_seconds(r["seconds"])
                ratio = ratio_time(r, by) / ratio_time(ref, by) if ref is not None else None
                ratio_cell = "reference" if r is ref else format_ratio(ratio) if ratios else ""
                remark = verdict(ratio) if ratio is not None and not r["ours"] else ""
                versus = compared_with(r, rows) if ratios and not r["ours"] else None
                if versus is not None and versus is not ref:
                    remark = (f"against {md_escape(versus['impl'])}: "
                              f"{verdict(ratio_time(r, by) / ratio_time(versus, by))}")
                if r.get("note"):
                    remark = f"{remark}; {md_escape(r['note'])}" if remark else md_escape(r["note"])
            cpu_cell = f" {format_seconds(r.get('cpu'))} |" if cpu else ""
            lines.append(f"| {md_escape(case) if i == 0 else ''} | {impl} | {time_cell} | "
                         f"{format_seconds(r.get('best'))} |{cpu_cell} {ratio_cell} | {remark} |")
    return "\n".join(lines)


def summary_table(records, runs, by="median"):
    lines = ["| benchmark | comparisons with peers | ptnative faster in | geometric mean of peer / ptnative | range |",
             "|---|--:|--:|--:|---|"]
    by_bench = {}
    for bench, _, _, ratio in comparisons(records, by):
        by_bench.setdefault(bench, []).append(ratio)
    for bench in dict.fromkeys([r["benchmark"] for r in runs] + list(by_bench)):
        ratios = by_bench.get(bench)
        if not ratios:
            lines.append(f"| [{bench}](#{bench}) | 0 | | | |")
            continue
        gmean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append(f"| [{bench}](#{bench}) | {len(ratios)} | {sum(r > 1 for r in ratios)} | {gmean:.3g} | "
                     f"{min(ratios):.3g} – {max(ratios):.3g} |")
    return "\n".join(lines)


def describe(bench):
    """The first paragraph of a benchmark script's docstring (read, not imported), on one line."""
    path = BENCH_DIR / f"{bench}.py"
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError):
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split()) if doc else ""


def load_sentence(runs, machine):
    measured = [(r["other_cores"], r["seconds"]) for r in runs if r.get("other_cores") is not None and r["seconds"]]
    if not measured:
        return "The load from other work was not measured."
    total = sum(s for _, s in measured)
    mean = sum(c * s for c, s in measured) / total
    peak = max(c for c, _ in measured)
    cores = machine.get("usable_cores") or machine.get("cores")
    if mean > OTHER_LOAD_NOTED:
        return (f"**Measured under load**: other processes kept on average {mean:.2f} of the {cores} cores busy "
                f"while the benchmarks ran (up to {peak:.2f} during one benchmark): absolute times are slower and "
                f"noisier than on a quiet machine; ratios suffer less where ptnative and its peers were timed in "
                f"alternating turns.")
    return (f"A quiet machine: other processes used on average {mean:.2f} of the {cores} cores while the "
            f"benchmarks ran.")


def render(records, runs, meta, png_name, chart_note):
    """The page's Markdown text."""
    machine, vers, by = meta.get("machine", {}), meta.get("versions", {}), meta.get("ratio_by", "median")
    by_bench = cases(records)
    mode = "quick settings (`--quick`)" if meta.get("quick") else "full settings"
    out = ["# Performance",
           "",
           "Written by `make bench` (`python bench/report.py`; `make bench BENCH_ARGS=--quick` for a short run); "
           "do not edit by hand. Each benchmark in `bench/` runs as its own process and times ptnative and its peers "
           "on the same data after checking that their results agree (each section says whether in alternating "
           "turns). Times are medians of the timed calls (best: the fastest call; CPU, where measured: the "
           "median process CPU time of a call, all its threads together, which a busy machine inflates less than wall "
           "time for one-thread code). In alternating turns, calls shorter than a millisecond are timed in batches "
           "of about a millisecond, each timing the batch's time per call (`timing.BATCH_SECONDS`). "
           "**time / ptnative** divides a row's "
           + ("fastest call (its median where no fastest call was measured) by that of " if by == "best" else
              "median by that of ")
           + "the case's first ptnative row (the reference, in bold): above 1 ptnative is faster, below 1 it is "
           "slower. A peer's verdict (last column) is against the reference, or, where it says so, against the "
           "ptnative row called the same way as that peer (e.g. `ptnative eager`: numpy arrays in and out, as "
           "hmmlearn is called)."
           + (" Ratios from the fastest calls (`--ratio-by best`) are steadier than medians on a machine "
              "that other work keeps busy." if by == "best" else ""),
           "",
           "Peers are optional packages: a missing one is a row that says *not installed*. To measure them all, "
           "install next to ptnative's dependencies: `torch` (CPU build), `torchaudio`, `jax`, `dynamax`, "
           "`hmmlearn`, `editdistance`, `rapidfuzz`, `matplotlib` (the chart), and `pymc` + `pymc-extras` for "
           "`bench/hmm_pymc.py`; then `make bench VENV=that-venv`, or run "
           "`PYTHONPATH=$PWD that-venv/bin/python bench/report.py` from the checkout.",
           "",
           f"Run of {meta.get('date') or 'an unknown date'}, {mode}, {sum(r['seconds'] for r in runs):.0f} s in all."]
    if meta.get("note"):
        out += ["", md_escape(meta["note"])]
    out += ["", "## Machine", "",
            f"- CPU: {machine.get('cpu', '?')}, {machine.get('cores', '?')} logical cores"
            + (f" ({machine['usable_cores']} usable by this run)" if machine.get("usable_cores") not in
               (None, machine.get("cores")) else "")
            + (f", {machine['memory_gib']} GiB memory" if machine.get("memory_gib") else ""),
            f"- OS: {machine.get('os', '?')}"
            + (f"; thread settings: {', '.join(f'{k}={v}' for k, v in machine['threads_env'].items())}"
               if machine.get("threads_env") else ""),
            f"- Load: {load_sentence(runs, machine)}"
            + (f" Load average at the start: {machine['load_average'][0]:.2f}." if machine.get("load_average")
               else ""),
            "", "## Versions", "", "| package | version |", "|---|---|"]
    for name, version in vers.items():
        out.append(f"| {name} | {md_escape(version) if version else 'not installed'} |")
    out += ["", "## At a glance", ""]
    out.append(f"![peer time / ptnative time per comparison](img/{png_name})" if not chart_note else
               f"(No chart: {chart_note}.)")
    out += ["", summary_table(records, runs, by), ""]
    for run in runs:
        bench = run["benchmark"]
        out += [f"## {bench}", "", f"`{run['command']}`: {describe(bench)}", ""]
        status = f"{run['seconds']:.0f} s"
        if run.get("other_cores") is not None:
            status += f", other processes busy on {run['other_cores']:.2f} cores on average"
        if run["status"] == "not run":
            out += [f"Not run: {run['output_tail']}.", ""]
            continue
        if run["status"] == "failed":
            out += [f"**Failed** (exit status {run['returncode']}, {status}); the end of its output:", "", "```",
                    run["output_tail"], "```", ""]
        else:
            out += [f"Ran in {status}." + (TURNS.get(run.get("alternating"), "") if bench in by_bench else ""), ""]
        if bench in by_bench:
            out += [benchmark_table(by_bench[bench], KNOWN.get(bench, Benchmark(bench)).ratios, by), ""]
        elif run["status"] == "ok":
            last = run["output_tail"].strip().splitlines()[-1:] or ["(no output)"]
            out += [f"No rows recorded; its output ends: `{md_escape(last[0])}`", ""]
    for bench in by_bench:  # rows of benchmarks without a run entry (records merged from elsewhere)
        if bench not in {r["benchmark"] for r in runs}:
            out += [f"## {bench}", "", benchmark_table(by_bench[bench], by=by), ""]
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------ chart
def draw_chart(records, png_path, by="median"):
    """A horizontal bar per peer comparison, log scale, 1 marked; returns the [(label, ratio)] drawn, top first.
    Raises ImportError without matplotlib, ValueError when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = comparisons(records, by)
    if not comps:
        raise ValueError("no peer was measured")
    bars = [(f"{case} vs {peer}", ratio) for _, case, peer, ratio in comps]
    slots = []  # top to bottom: (label, ratio), a benchmark's name heading its group with ratio None
    for i, (bench, _, _, _) in enumerate(comps):
        if i == 0 or bench != comps[i - 1][0]:
            slots.append((bench, None))
        slots.append(bars[i])
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.28 * len(slots)))
    y = list(range(len(slots)))[::-1]
    logs = [math.log10(r) for _, r in bars]
    lo, hi = min(min(logs), 0), max(max(logs), 0)
    pad = 0.15 * max(hi - lo, 0.5)
    ax.set_xlim(lo - pad, hi + pad)
    for yi, (label, r) in zip(y, slots):
        if r is None:
            ax.axhline(yi + 0.5, color="grey", linewidth=0.6)
            continue
        ax.barh(yi, math.log10(r), color="#2a9d4a" if r >= 1 else "#d1495b", height=0.7)
        ax.text(math.log10(r), yi, f" {r:.3g}x " if r < 10 else f" {r:.0f}x ", va="center",
                ha="left" if r >= 1 else "right", fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ticks = list(range(math.floor(lo - pad), math.ceil(hi + pad) + 1))
    ax.set_xticks(ticks, [f"{10.0 ** t:g}x" for t in ticks])
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_yticks(y, [label for label, _ in slots], fontsize=8)
    for tick, (_, r) in zip(ax.get_yticklabels(), slots):
        if r is None:
            tick.set_fontweight("bold")
            tick.set_fontsize(10)
    ax.set_ylim(-0.6, len(slots) - 0.4)
    ax.set_title(f"peer time / ptnative time ({'fastest calls' if by == 'best' else 'medians'}; above 1: ptnative "
                 "is faster)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return bars


def write_report(records, runs, meta, md_path, png_path):
    """Draw the chart (if matplotlib is there and a peer was measured), then write the page; returns the page."""
    chart_note = None
    try:
        draw_chart(records, png_path, meta.get("ratio_by", "median"))
    except ImportError:
        chart_note = "matplotlib is not installed"
    except ValueError as e:
        chart_note = str(e)
    text = render(records, runs, meta, Path(png_path).name, chart_note)
    Path(md_path).parent.mkdir(parents=True, exist_ok=True)
    Path(md_path).write_text(text, encoding="utf-8")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="each benchmark's short settings")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: all in bench/)")
    parser.add_argument("--note", default="", help="a sentence for the page (e.g. what else ran meanwhile)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per benchmark before it is killed")
    parser.add_argument("--keep-records", default=None, help="keep the raw rows in this JSON-lines file")
    parser.add_argument("--from-records", nargs="+", default=None, metavar="FILE",
                        help="write the page from kept files, measuring nothing; a benchmark in several files is "
                             "taken from the last one (re-measure one with --only and --keep-records)")
    parser.add_argument("--ratio-by", choices=("median", "best"), default=None,
                        help="which time the ratios and the chart divide: each row's median (default) or its fastest "
                             "call (steadier on a busy machine)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    parser.add_argument("--png", default=None, help="default: img/performance.png next to --out")
    args = parser.parse_args(argv)
    png = args.png or str(Path(args.out).parent / "img" / "performance.png")

    if args.from_records:
        records, runs, meta = merge_records([read_records(f) for f in args.from_records])
    else:
        path = Path(args.keep_records) if args.keep_records else Path(tempfile.mkstemp(suffix=".jsonl")[1])
        path.write_text("")
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick,
                "note": args.note, "machine": machine_info(), "versions": versions()}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"meta": meta}) + "\n")
        for bench in benchmarks([n for n in args.only.split(",") if n]):
            print(f"== bench/{bench.name}.py", flush=True)
            run = run_benchmark(bench, args.quick, path, args.timeout)
            print(f"== bench/{bench.name}.py: {run['status']} ({run['seconds']:.0f} s)", flush=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"run": run}) + "\n")
        records, runs, _ = read_records(path)
        if not args.keep_records:
            path.unlink()
    if args.ratio_by:
        meta["ratio_by"] = args.ratio_by
    write_report(records, runs, meta, args.out, png)
    failed = [r["benchmark"] for r in runs if r["status"] == "failed"]
    print(f"wrote {args.out} and {png}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
