"""Run many short Python children without paying Python's and PyTensor's start-up for each one.

``ForkServer(preload)`` starts one Python process that imports ``preload`` (and nothing else: no kernel is built
or loaded, no cache is touched) and then forks a child for each ``run(code, args, env, cwd)``.  The child takes
``env`` as its whole environment, ``cwd`` as its directory and ``args`` as ``sys.argv[1:]``, runs ``code`` as
``python -c code args...`` would (a traceback and status 1 on an exception, ``SystemExit``'s status, the exit
handlers at the end) with its output in files of its own, and is reaped by the server.  A child that crashes
(SIGBUS in ``dlopen``, foreign code) ends alone: ``run`` returns the negative signal number as its returncode, as
``subprocess.run`` does, and the server keeps serving.  Environment variables that the preloaded modules read
when imported are the server's, so ``env`` may differ from the server's only in variables read later (ptnative
reads its own at each use).
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

SERVER = textwrap.dedent("""
    import atexit, json, os, sys, traceback
    for name in json.loads(sys.argv[1]):
        __import__(name)
    replies = os.fdopen(int(sys.argv[2]), "w", buffering=1)

    def child(req):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        replies.close()
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.argv = ["-c", *req["args"]]
        rc = 0
        try:
            exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            rc = 1
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)

    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(req)
        print(json.dumps({"pid": pid}), file=replies)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=replies)
""")


class ForkServer:
    """See the module's docstring.  ``env``: the server's environment (default: this process's)."""

    def __init__(self, preload, env=None):
        rfd, wfd = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(list(preload)), str(wfd)],
                                     stdin=subprocess.PIPE, text=True, pass_fds=(wfd,), env=env)
        os.close(wfd)
        self.replies, self.buffer = rfd, b""

    def _reply(self, deadline):
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.replies], [], [], left)[0]:
                return None
            chunk = os.read(self.replies, 4096)
            if not chunk:
                raise RuntimeError(f"the fork server exited with status {self.proc.wait()}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, code, args=(), env=None, cwd=None, timeout=600.0):
        """``subprocess.run([python, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=timeout)``, in a child forked from the server; ``subprocess.TimeoutExpired`` after killing it."""
        with tempfile.TemporaryDirectory() as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            req = {"code": code, "args": [str(a) for a in args], "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd or os.getcwd()), "stdout": out, "stderr": err}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout
            pid = self._reply(deadline + 60)["pid"]
            done = self._reply(deadline)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(time.monotonic() + 60)
                raise subprocess.TimeoutExpired(["-c", code, *args], timeout)
            with open(out) as o, open(err) as e:
                return subprocess.CompletedProcess(["-c", code, *args], done["returncode"], o.read(), e.read())

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.replies)
