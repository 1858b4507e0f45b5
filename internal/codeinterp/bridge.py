# Warren's code-interpreter bridge: one per context. It starts one Jupyter
# kernel (ipykernel, or IRkernel for R) as its child, talks to it with
# jupyter_client over IPC sockets in the context's private directory (TCP on
# loopback for IRkernel, which speaks no IPC), and
# speaks JSON lines with envd's code-interpreter server (internal/codeinterp)
# on stdin/stdout.
#
#   argv:   bridge.py <language> <cwd> <rundir> [<max user processes>]
#   stdout: {"type":"ready"} or {"type":"fatal","message":...} first; then,
#           per execute, the wire events of E2B's /execute (stdout, stderr,
#           result, error, number_of_executions) and {"type":"end"}, with
#           "dead": true when this bridge exits after it (its kernel died
#           and could not be replaced).
#   stdin:  {"op":"execute","code":...,"env":{...},"sandbox_env":{...}} runs
#           a cell (env for this run; sandbox_env: the sandbox's variables
#           set since the kernel started, for good; max_output and
#           max_line: its output's bounds, in bytes of these lines);
#           {"op":"interrupt"} sends SIGINT to the kernel at once (read by a
#           thread of its own, so that it reaches a running cell).
#
# The kernel is this process's child in this process's group: the server
# ends a context by killing the group. Written for Warren; runs as the
# sandbox's user.
import codecs
import datetime
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

_out_lock = threading.Lock()

# The running execution's output bounds, sent by the server with each
# execute (its Config.MaxOutputBytes and MaxLineBytes, in bytes of these
# JSON lines): past them output is dropped here, with the notes the server
# would write, so that what the server drops anyway never crosses the
# pipe. The server applies the same bounds to what it reads.
_bounds = {"max_output": 0, "max_line": 0, "left": 0, "cut": False}
OUTPUT_TYPES = ("stdout", "stderr", "result")
# A stream's text goes out in events of at most this many characters:
# ipykernel sends what a cell wrote between two flushes as one message,
# megabytes when it writes fast, and the server reads a line whole.
TEXT_CHUNK = 32 * 1024


def start_output(max_output, max_line):
    with _out_lock:
        _bounds.update(max_output=max_output or 0, max_line=max_line or 0, left=max_output or 0, cut=False)


def emit(obj):
    # A lone surrogate (a cell may print one) has no UTF-8: replaced.
    line = json.dumps(obj, default=str, ensure_ascii=False).encode("utf-8", "replace")
    with _out_lock:
        if obj.get("type") in OUTPUT_TYPES and _bounds["max_output"] > 0:
            if _bounds["cut"]:
                return
            if _bounds["max_line"] > 0 and len(line) > _bounds["max_line"]:
                line = note("[warren: an output of this cell was larger than %d bytes and was dropped]\n" % _bounds["max_line"])
            if len(line) > _bounds["left"]:
                _bounds["cut"] = True
                line = note("[warren: this cell's output passed %d bytes; the rest is dropped]\n" % _bounds["max_output"])
            else:
                _bounds["left"] -= len(line)
        sys.stdout.buffer.write(line + b"\n")
        sys.stdout.buffer.flush()


def note(text):
    return json.dumps({"type": "stderr", "text": text}).encode()


def emit_text(name, text, timestamp):
    """Emits a stream's text in events of at most TEXT_CHUNK characters,
    cut after a newline where there is one in the chunk's second half."""
    start = 0
    while start < len(text):
        end = start + TEXT_CHUNK
        if end < len(text):
            end = text.rfind("\n", start + TEXT_CHUNK // 2, end) + 1 or end
        emit({"type": name, "text": text[start:end], "timestamp": timestamp})
        if _bounds["cut"]:
            return
        start = end


def stamp(msg):
    date = msg.get("header", {}).get("date")
    return date.isoformat() if hasattr(date, "isoformat") else date


def result_event(data, main):
    ev = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            ev[field] = value
    text = ev.get("text")
    # A string's repr is quoted; E2B's server gives it without the quotes.
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        ev["text"] = text[1:-1]
    if extra:
        ev["extra"] = extra
    return ev


def r_string(s):
    """s as an R string literal: JSON's escapes are R's too."""
    return json.dumps(s, ensure_ascii=False)


class Kernel:
    """A Python context: ipykernel."""

    def __init__(self, cwd, rundir):
        self.cwd = cwd
        self.rundir = rundir
        self.proc = None
        self.client = None
        self.base_env = dict(os.environ)

    def connection(self, conn):
        write_connection_file(conn, ip=os.path.join(self.rundir, "k"), transport="ipc")

    def argv(self, conn):
        return [sys.executable, "-m", "ipykernel_launcher", "-f", conn]

    def prepare(self):
        """Runs once the kernel answers: Warren's e2b/data and e2b/chart
        formatters (formatters.py, beside this file), in a namespace of
        their own."""
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "formatters.py")
        self.run_silent("exec(compile(open(%r).read(), %r, 'exec'), {'__name__': '__warren_formatters__'})" % (path, path))

    def start(self):
        conn = os.path.join(self.rundir, "kernel.json")
        for name in os.listdir(self.rundir):
            if name.startswith("k-") or name == "kernel.json":
                os.unlink(os.path.join(self.rundir, name))
        self.connection(conn)
        self.proc = subprocess.Popen(
            self.argv(conn),
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        # The kernel's own stderr (a cell's goes to iopub): its last bytes
        # explain a failed start.
        self.stderr_tail = b""
        threading.Thread(target=self.keep_stderr, args=(self.proc.stderr,), daemon=True).start()
        kc = BlockingKernelClient(connection_file=conn)
        kc.load_connection_file()
        kc.start_channels()
        try:
            self.wait_ready(kc, 120)
        except RuntimeError as e:
            kc.stop_channels()
            self.stop()
            tail = self.stderr_tail.decode("utf-8", "replace").strip()
            raise RuntimeError("the kernel did not start: %s%s" % (e, "; its stderr ended with: " + tail if tail else ""))
        self.client = kc
        self.prepare()

    def wait_ready(self, kc, timeout):
        # Not kc.wait_for_ready: without a kernel manager it takes a
        # heartbeat not yet seen (a busy machine) for a dead kernel.
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("it exited with status %d" % self.proc.returncode)
            if time.monotonic() > deadline:
                raise RuntimeError("no answer within %d s" % timeout)
            kc.kernel_info()
            try:
                kc.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            break
        # What the kernel published while the client joined.
        while True:
            try:
                kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                break
        while True:
            try:
                kc.get_shell_msg(timeout=0)
            except queue.Empty:
                break

    def keep_stderr(self, pipe):
        for chunk in iter(lambda: pipe.read1(4096), b""):
            self.stderr_tail = (self.stderr_tail + chunk)[-2048:]

    def stop(self):
        if self.client is not None:
            self.client.stop_channels()
            self.client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def interrupt(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)

    def died(self):
        return self.proc is None or self.proc.poll() is not None

    def run_silent(self, code):
        """Runs code out of the user's history and output; True if it finished."""
        msg_id = self.client.execute(code, silent=True, store_history=False, allow_stdin=False, stop_on_error=False)
        return self.wait_idle(msg_id, None)

    def wait_idle(self, msg_id, on_msg):
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if self.died():
                    return False
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                self.drain_shell(msg_id)
                return True
            if on_msg is not None:
                on_msg(msg)

    def drain_shell(self, msg_id):
        """Reads the shell channel's replies; notes whether msg_id's says
        the kernel aborted the request instead of running it."""
        self.aborted = False
        deadline = time.monotonic() + 2
        seen = False
        while True:
            try:
                # The reply usually precedes idle; a little wait for it.
                reply = self.client.get_shell_msg(timeout=0 if seen else max(0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                seen = True
                self.aborted = reply.get("content", {}).get("status") == "aborted"

    def set_sandbox_env(self, env):
        """The sandbox's variables, set after this kernel started: for good."""
        self.base_env.update(env)
        self.run_silent(self.env_code(env))

    def env_code(self, env):
        return "__import__('os').environ.update(%r)" % (dict(env),)

    def restore_env_code(self, env):
        keep = {k: self.base_env[k] for k in env if k in self.base_env}
        drop = [k for k in env if k not in self.base_env]
        return "__import__('os').environ.update(%r)\nfor _k in %r: __import__('os').environ.pop(_k, None)\ndel _k" % (keep, drop)

    def execute(self, code, env):
        if env and not self.run_silent(self.env_code(env)):
            return self.report_death()
        state = {"errored": False}

        def on_msg(msg):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                name = content.get("name")
                if name in ("stdout", "stderr"):
                    emit_text(name, content.get("text", ""), stamp(msg))
            elif kind == "execute_input":
                emit({"type": "number_of_executions", "execution_count": content.get("execution_count")})
            elif kind == "execute_result":
                emit(result_event(content.get("data", {}), True))
            elif kind == "display_data":
                emit(result_event(content.get("data", {}), False))
            elif kind == "error" and not state["errored"]:
                state["errored"] = True
                emit({
                    "type": "error",
                    "name": content.get("ename", ""),
                    "value": content.get("evalue", ""),
                    "traceback": "".join(content.get("traceback", [])),
                })

        # stop_on_error=False: with it, ipykernel aborts the requests that
        # reach it shortly after a failed cell, and the next user's cell
        # (one runs at a time here: nothing else is ever queued) would
        # come back empty.
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        if not self.wait_idle(msg_id, on_msg):
            return self.report_death()
        if getattr(self, "aborted", False) and not state["errored"]:
            emit({"type": "error", "name": "ExecutionAborted", "value": "Execution was aborted", "traceback": ""})
        if env and not self.run_silent(self.restore_env_code(env)):
            return self.report_death()

    def report_death(self):
        code = self.proc.returncode if self.proc is not None else None
        why = "the kernel exited"
        if code is not None and code < 0:
            why += " (killed by signal %d%s)" % (-code, ", perhaps out of memory" if -code == signal.SIGKILL else "")
        elif code is not None:
            why += " (status %d)" % code
        emit({"type": "error", "name": "KernelDied", "value": why + "; its state is lost and a new kernel was started", "traceback": ""})
        self.stop()
        try:
            self.start()
        except Exception as e:  # the next execute finds the context dead
            emit({"type": "error", "name": "KernelDied", "value": "restarting the kernel failed: %s" % e, "traceback": ""})
            emit({"type": "end", "dead": True})
            sys.exit(1)


class RKernel(Kernel):
    """An R context: IRkernel (Debian's r-cran-irkernel). IRkernel builds
    its socket addresses as transport://ip:port, which fits TCP only: its
    sockets are on loopback, their messages signed with the connection
    file's key (in the context's private directory)."""

    def connection(self, conn):
        write_connection_file(conn, ip="127.0.0.1", transport="tcp")

    def argv(self, conn):
        return ["R", "--slave", "--no-save", "--no-restore", "-e", "IRkernel::main()", "--args", conn]

    def prepare(self):
        pass

    def env_code(self, env):
        return "Sys.setenv(%s)" % ", ".join("%s = %s" % (r_string(k), r_string(v)) for k, v in env.items())

    def restore_env_code(self, env):
        keep = {k: self.base_env[k] for k in env if k in self.base_env}
        drop = [k for k in env if k not in self.base_env]
        code = []
        if keep:
            code.append(self.env_code(keep))
        if drop:
            code.append("Sys.unsetenv(c(%s))" % ", ".join(r_string(k) for k in drop))
        return "\n".join(code) or "invisible(NULL)"


class BashShell:
    """A bash context: one long-lived bash that sources each cell, so that
    variables, functions and the working directory carry over. It shares
    the bridge's process group, and an interrupt is SIGINT to the group:
    the running command dies, bash's trap ends the cell, the bridge
    ignores it."""

    def __init__(self, cwd, rundir):
        self.cwd = cwd
        self.rundir = rundir
        self.proc = None
        self.base_env = dict(os.environ)
        self.lock = threading.Lock()
        self.current = None  # the running cell: its marker and done events

    def start(self):
        self.proc = subprocess.Popen(
            ["/bin/bash", "--noprofile", "--norc"],
            cwd=self.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # A cell's interrupt returns from the cell's source, not from bash.
        self.proc.stdin.write(b"trap 'return 130 2>/dev/null' INT\n")
        self.proc.stdin.flush()
        for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            threading.Thread(target=self.relay, args=(pipe, name), daemon=True).start()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def interrupt(self):
        # Only a running cell is interrupted: the server's repeats of an
        # interrupt can reach this bridge after the cell ended, and must
        # not land in the next one.
        if self.current is None:
            return
        os.killpg(os.getpgid(0), signal.SIGINT)

    def died(self):
        return self.proc is None or self.proc.poll() is not None

    def relay(self, pipe, name):
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        buf = b""
        while True:
            chunk = pipe.read1(65536)
            if not chunk:
                return
            buf += chunk
            cell = self.current
            if cell is None:
                buf = b""  # a background job's output between cells
                continue
            marker = b"\n" + cell["marker"]
            i = buf.find(marker)
            if i >= 0:
                end = buf.find(b"\n", i + len(marker))
                if end < 0:
                    continue
                text = decoder.decode(buf[:i], final=True)
                if text:
                    emit({"type": name, "text": text, "timestamp": now()})
                status = buf[i + len(marker):end].strip()
                if name == "stdout":
                    cell["status"] = int(status or b"0")
                buf = b""
                cell[name].set()
                continue
            # Hold back only what could be the start of the marker.
            keep = next((k for k in range(min(len(buf), len(marker) - 1), 0, -1) if buf.endswith(marker[:k])), 0)
            text = decoder.decode(buf[:len(buf) - keep])
            buf = buf[len(buf) - keep:]
            if text:
                emit({"type": name, "text": text, "timestamp": now()})

    def set_sandbox_env(self, env):
        self.base_env.update(env)
        self.pending = getattr(self, "pending", "") + "".join(
            "export %s=%s; " % (k, shlex.quote(v)) for k, v in env.items() if valid_name(k))

    def execute(self, code, env):
        marker = ("__warren_end_%s__" % os.urandom(8).hex()).encode()
        path = os.path.join(self.rundir, "cell.sh")
        with open(path, "w") as f:
            f.write(code)
            f.write("\n")
        sets = "".join("export %s=%s; " % (k, shlex.quote(v)) for k, v in env.items() if valid_name(k))
        restore = "".join(
            ("export %s=%s; " % (k, shlex.quote(self.base_env[k])) if k in self.base_env else "unset %s; " % k)
            for k in env if valid_name(k)
        )
        sets = getattr(self, "pending", "") + sets
        self.pending = ""
        line = "%s. %s; __warren_rc=$?; %sprintf '\\n%%s %%d\\n' %s \"$__warren_rc\"; printf '\\n%%s\\n' %s >&2\n" % (
            sets, shlex.quote(path), restore, marker.decode(), marker.decode())
        status = self.run_marked(marker, line)
        if status != 0:
            emit({"type": "error", "name": "Error", "value": "exit status %d" % status, "traceback": ""})

    def run_marked(self, marker, line):
        """Sends line, relays the output until both streams' marker, and
        returns the status the stdout marker carried."""
        cell = {"marker": marker, "stdout": threading.Event(), "stderr": threading.Event(), "status": 0}
        self.current = cell
        self.count = getattr(self, "count", 0) + 1
        emit({"type": "number_of_executions", "execution_count": self.count})
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except OSError:
            pass
        while not (cell["stdout"].wait(0.5) and cell["stderr"].wait(0.5)):
            if self.died():
                self.current = None
                emit({"type": "error", "name": "KernelDied", "value": "the context's process exited (status %s); its state is lost" % self.proc.returncode, "traceback": ""})
                emit({"type": "end", "dead": True})
                sys.exit(1)
        self.current = None
        return cell["status"]


class NodeShell(BashShell):
    """A JavaScript or TypeScript context: one long-lived Node process
    (jsrunner.js, beside this file) that runs each cell in a persistent vm
    context (a TypeScript cell compiled first). Its
    output is relayed, marked and interrupted like a bash context's; the
    cell's value or exception comes back in a file."""

    # Node dies of a SIGINT that lands while vm.runInContext swaps its
    # handlers (between removing the process's listeners and starting its
    # watchdog, and between stopping the watchdog and putting them back):
    # there SIGINT is the default action, or Node's own exit. So a context
    # gets at most one SIGINT per cell, and only once jsrunner said, on its
    # status pipe, that the cell runs ("r <marker>"; "d <marker>" when it
    # returned), 0.1 s after that word, when the watchdog is long up. An
    # interrupt that comes before is held until then; one that comes after
    # the cell's run (an awaited promise: SIGINT could not stop it anyway)
    # is dropped, and the server's drain timeout ends the context.
    signal_delay = 0.1

    def start(self):
        runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jsrunner.js")
        status_r, status_w = os.pipe()
        self.proc = subprocess.Popen(
            ["node", runner, self.language, str(status_w)],
            cwd=self.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
        )
        os.close(status_w)
        for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            threading.Thread(target=self.relay, args=(pipe, name), daemon=True).start()
        threading.Thread(target=self.read_status, args=(os.fdopen(status_r, "rb"),), daemon=True).start()

    def read_status(self, pipe):
        for line in pipe:
            word, _, marker = line.strip().partition(b" ")
            with self.lock:
                cell = self.current
                if cell is None or cell["marker"] != marker:
                    continue
                if word == b"r":
                    cell["running"] = time.monotonic()
                    if cell.get("wanted"):
                        self.signal_later(cell)
                elif word == b"d":
                    cell["running"] = None

    def interrupt(self):
        with self.lock:
            cell = self.current
            if cell is None or cell.get("wanted"):
                return
            cell["wanted"] = True
            if cell.get("running"):
                self.signal_later(cell)

    def signal_later(self, cell):
        """Sends the cell its SIGINT once it has run signal_delay, if it
        still runs then. Called with self.lock held."""
        wait = cell["running"] + self.signal_delay - time.monotonic()

        def send():
            with self.lock:
                if self.current is cell and cell.get("running"):
                    os.killpg(os.getpgid(0), signal.SIGINT)

        if wait > 0:
            threading.Timer(wait, send).start()
        else:
            os.killpg(os.getpgid(0), signal.SIGINT)

    def set_sandbox_env(self, env):
        self.pending_env = dict(getattr(self, "pending_env", {}), **env)

    def execute(self, code, env):
        marker = ("__warren_end_%s__" % os.urandom(8).hex()).encode()
        path = os.path.join(self.rundir, "cell.js")
        out = os.path.join(self.rundir, "result.json")
        with open(path, "w") as f:
            f.write(code)
        if os.path.exists(out):
            os.unlink(out)
        req = {"path": path, "marker": marker.decode(), "out": out, "env": env,
               "sandbox_env": getattr(self, "pending_env", {})}
        self.pending_env = {}
        self.run_marked(marker, json.dumps(req) + "\n")
        try:
            with open(out) as f:
                res = json.load(f)
        except (OSError, ValueError):
            return
        if "text" in res:
            emit(result_event({"text/plain": res["text"]}, True))
        if "error" in res:
            emit(dict(res["error"], type="error"))


def valid_name(k):
    return k.replace("_", "a").isalnum() and not k[0].isdigit()


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def read_ops(kernel, ops):
    for line in sys.stdin:
        try:
            op = json.loads(line)
        except ValueError:
            continue
        if op.get("op") == "interrupt":
            kernel.interrupt()
        else:
            ops.put(op)
    ops.put(None)


def limit_processes(n):
    """Sets RLIMIT_NPROC (soft and hard: a cell cannot raise it) to n, or
    to the hard limit if that is lower, before anything forks."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard != resource.RLIM_INFINITY:
        n = min(n, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


def main():
    language, cwd, rundir = sys.argv[1], sys.argv[2], sys.argv[3]
    nproc = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    if nproc > 0:
        try:
            limit_processes(nproc)
        except (OSError, ValueError) as e:
            emit({"type": "fatal", "message": "cannot limit the kernel's processes: %s" % e})
            return 1
    kinds = {"python": Kernel, "r": RKernel, "bash": BashShell, "javascript": NodeShell, "typescript": NodeShell}
    if language not in kinds:
        emit({"type": "fatal", "message": "unsupported language %r" % language})
        return 1
    if not os.path.isdir(cwd):
        emit({"type": "fatal", "message": "cwd %s is not a directory this user can use" % cwd})
        return 1
    # An interrupt of a bash cell is SIGINT to this process group.
    signal.signal(signal.SIGINT, lambda *_: None)
    kernel = kinds[language](cwd, rundir)
    kernel.language = language
    try:
        kernel.start()
    except Exception as e:
        emit({"type": "fatal", "message": str(e)})
        return 1
    emit({"type": "ready"})
    ops = queue.Queue()
    threading.Thread(target=read_ops, args=(kernel, ops), daemon=True).start()
    try:
        while True:
            op = ops.get()
            if op is None:
                return 0
            if op.get("op") == "execute":
                if op.get("sandbox_env"):
                    kernel.set_sandbox_env(op["sandbox_env"])
                start_output(op.get("max_output"), op.get("max_line"))
                kernel.execute(op.get("code", ""), op.get("env") or {})
                emit({"type": "end"})
    finally:
        kernel.stop()


if __name__ == "__main__":
    sys.exit(main())
