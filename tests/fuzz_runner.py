"""The parent side of tests/fuzz_worker.py: a long-lived child process that runs fuzz cases and survives
nothing it should not (a crash or a hang of the child is reported as a failed case, and the next request
starts a fresh child)."""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class WorkerDied(Exception):
    """The child crashed or hung while running ``case``."""

    def __init__(self, case, how, output_tail, results=()):
        self.case, self.how, self.output_tail, self.results = case, how, output_tail, list(results)
        super().__init__(f"the fuzz worker {how} while running case {case!r}\n--- its output (tail):\n{output_tail}")


class Worker:
    """``Worker().run(request, timeout)`` -> list of case results (dicts, see fuzz_worker's docstring)."""

    def __init__(self):
        self.proc = None
        self.log = None

    def _start(self):
        env = dict(os.environ)
        assert env.get("PTNATIVE_CACHE_DIR"), "tests/conftest.py sets the test kernel cache"
        env.setdefault("PYTHONFAULTHANDLER", "1")
        self.rfd, wfd = os.pipe()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fuzz_worker.py"), str(wfd)],
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     pass_fds=(wfd,), cwd=ROOT, text=True)
        os.close(wfd)
        self.buffer = b""

    def _output_tail(self):
        self.log.seek(0)
        return self.log.read()[-4000:].decode(errors="replace")

    def _lines(self, deadline):
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                yield json.loads(line)
            left = deadline - time.monotonic()
            if left <= 0:
                yield None  # timed out
                return
            ready, _, _ = select.select([self.rfd], [], [], min(left, 5.0))
            if ready:
                chunk = os.read(self.rfd, 65536)
                if not chunk:
                    return  # EOF: the child is gone
                self.buffer += chunk

    def run(self, request, timeout=600.0):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        results, current = [], None
        for msg in self._lines(time.monotonic() + timeout):
            if msg is None:
                self.close()
                raise WorkerDied(current, f"hung (no answer within {timeout:.0f} s)", self._output_tail(), results)
            if "begin" in msg:
                current = msg["begin"]
            elif "done" in msg:
                return results
            elif "error" in msg:
                for rest in self._lines(time.monotonic() + 60):  # read up to this request's "done"
                    if rest is None or "done" in rest:
                        break
                raise AssertionError(f"the fuzz worker could not run {request!r}:\n{msg['error']}")
            else:
                results.append(msg)
                current = None
        rc = self.proc.wait(timeout=30)
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
        tail = self._output_tail()
        self.proc = None
        raise WorkerDied(current, how, tail, results)

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def run_isolated(worker, request, timeout=600.0):
    """Run every case of ``request``; a case that kills the worker becomes a failed result with
    status ``"crash"`` and the others still run (in a fresh worker)."""
    crashed, results = [], []
    while True:
        try:
            results += worker.run(dict(request, skip=[c["case"] for c in crashed] + [r["case"] for r in results]),
                                  timeout)
            return results + crashed
        except WorkerDied as e:
            if e.case is None:
                raise
            results += e.results
            crashed.append({"case": e.case, "category": e.case.split(":")[0], "status": "crash",
                            "message": f"{e.how}\n{e.output_tail}"})
