#!/usr/bin/python3
"""proxyepd and `proxyep status` end to end: real daemons on sockets in fresh temporary
directories, real clients (the CLI, and raw frames spoken from here), real signals.

Usage: test_proxyepd.py --proxyepd PATH --proxyep PATH CASE  (CASE: one of CASES below)
Exit 0: passed; 1: failed (the reason on stderr); 77: skipped (the reason printed).

Every wait is a poll with a deadline (for a socket to accept, a process to exit, a log line to
appear), never a sleep standing in for an event. Every daemon a case starts is killed by its pid
when the case ends, whatever happened, and the temporary directory is removed.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def wait_for(predicate, seconds, what):
    """Polls `predicate` every 10 ms until it returns a true value or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.01)


# --- the wire, spoken from Python (independent of the C++ codec) ---------------------------


def frame(message):
    payload = json.dumps(message).encode()
    return struct.pack("<I", len(payload)) + payload


def parse_frames(data):
    frames = []
    while len(data) >= 4:
        (n,) = struct.unpack("<I", data[:4])
        if len(data) < 4 + n:
            break
        frames.append(json.loads(data[4:4 + n]))
        data = data[4 + n:]
    return frames


def exchange(path, message, seconds=5):
    """Sends one frame, returns every frame the daemon sends before it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(seconds)
        s.connect(path)
        try:
            s.sendall(frame(message))
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it read: its error frame is still there to read
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return parse_frames(data)
            data += chunk


def hello(**fields):
    message = {"proxyep": "hello", "version": 1, "kind": "status", "pid": os.getpid(),
               "capabilities": []}
    message.update(fields)
    return message


# --- daemons ---------------------------------------------------------------------------------


class Case:
    def __init__(self, args):
        self.proxyepd = args.proxyepd
        self.proxyep = args.proxyep
        self.tmp = tempfile.mkdtemp(prefix="proxyepd-test-")
        self.daemons = []  # (Popen, log path)

    def close(self):
        for process, _ in self.daemons:
            if process.poll() is None:
                process.kill()  # by its pid; only processes this case started
                process.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def socket_path(self, name="run/proxyepd.sock"):
        return os.path.join(self.tmp, name)

    def start(self, path, *extra, ready=True):
        """Starts a proxyepd on `path`; with `ready`, waits until it answers a status hello."""
        log = os.path.join(self.tmp, f"proxyepd-{len(self.daemons)}.log")
        with open(log, "wb") as out:
            process = subprocess.Popen([self.proxyepd, "--socket", path, *extra],
                                       stdout=out, stderr=subprocess.STDOUT)
        self.daemons.append((process, log))
        if ready:
            wait_for(lambda: self.serving(process, log), 20, f"proxyepd to serve {path}")
        return process, log

    @staticmethod
    def serving(process, log):
        if process.poll() is not None:
            raise Failure(f"proxyepd exited with {process.returncode}:\n{read(log)}")
        return "proxyepd: serving" in read(log)

    def status(self, path, *extra, timeout_ms=5000, user=None):
        command = [self.proxyep, "status", "--socket", path, "--timeout-ms", str(timeout_ms),
                   *extra]
        if user is not None:
            command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups",
                       *command]
        start = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        return done, time.monotonic() - start


def read(path):
    with open(path, "r", errors="replace") as f:
        return f.read()


def scrape(port):
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            samples[key] = sample.value
    return samples


def refused(samples):
    return samples[("proxyep_daemon_connections_total", (("outcome", "refused"),))]


def metrics_port(log):
    text = wait_for(lambda: "proxyepd: metrics at" in read(log) and read(log), 10,
                    "the metrics line in the daemon's log")
    line = next(l for l in text.splitlines() if "proxyepd: metrics at" in l)
    return int(line.rsplit(":", 1)[1].split("/")[0])


# --- cases -------------------------------------------------------------------------------------


def case_status_json(c):
    path = c.socket_path()
    daemon, _ = c.start(path)
    check(oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o750",
          "the socket directory was not created with mode 0750")
    check(oct(os.stat(path).st_mode & 0o777) == "0o660", "the socket is not mode 0660")
    done, _ = c.status(path, "--json")
    check(done.returncode == 0, f"proxyep status --json failed: {done.stderr}")
    status = json.loads(done.stdout)
    check(status["pid"] == daemon.pid, f"status shows pid {status['pid']}, not {daemon.pid}")
    check(status["socket"] == path and status["version"] == 1, f"status: {status}")
    check(status["draining"] is False and status["clients_attached"] == 0, f"status: {status}")
    check(status["connections"]["accepted"] >= 1, f"status: {status}")
    check(status["uptime_s"] >= 0 and status["metrics_url"] is None, f"status: {status}")
    done, _ = c.status(path)
    check(done.returncode == 0 and f"proxyepd pid {daemon.pid}" in done.stdout,
          f"summary: {done.stdout}{done.stderr}")


def case_second_daemon_refused(c):
    path = c.socket_path()
    first, _ = c.start(path)
    second, log = c.start(path, ready=False)
    second.wait(timeout=20)
    check(second.returncode == 1, f"the second proxyepd exited with {second.returncode}")
    check(f"another proxyepd serves {path}" in read(log),
          f"the second proxyepd's error does not name the path:\n{read(log)}")
    done, _ = c.status(path, "--json")
    check(done.returncode == 0 and json.loads(done.stdout)["pid"] == first.pid,
          "the first daemon no longer serves its socket")


def case_stale_socket_replaced(c):
    path = c.socket_path()
    first, _ = c.start(path)
    first.kill()
    first.wait()
    check(os.path.exists(path), "a SIGKILLed daemon should leave its socket file behind")
    second, log = c.start(path)
    check("replaced the stale socket" in read(log), f"no word of the stale socket:\n{read(log)}")
    done, _ = c.status(path, "--json")
    check(done.returncode == 0 and json.loads(done.stdout)["pid"] == second.pid,
          f"the new daemon does not serve: {done.stderr}")


def case_killed_daemon_fails_fast(c):
    path = c.socket_path()
    daemon, _ = c.start(path)
    daemon.kill()
    daemon.wait()
    done, seconds = c.status(path, timeout_ms=5000)
    check(done.returncode == 1, f"status exited with {done.returncode}")
    check(f"no proxyepd at {path}: connection refused" in done.stderr,
          f"status does not name the socket and the reason: {done.stderr}")
    check(seconds < 4, f"status took {seconds:.1f} s to fail (timeout 5 s)")
    missing = c.socket_path("nowhere.sock")
    done, seconds = c.status(missing, timeout_ms=5000)
    check(done.returncode == 1 and f"no proxyepd at {missing}: no such file" in done.stderr,
          f"no socket at all: {done.stderr}")


def case_stopped_daemon_times_out(c):
    path = c.socket_path()
    daemon, _ = c.start(path)
    os.kill(daemon.pid, signal.SIGSTOP)  # alive, its socket accepts into the backlog, no answer
    try:
        done, seconds = c.status(path, timeout_ms=500)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    check(done.returncode == 1, f"status exited with {done.returncode}")
    check(f"proxyepd at {path} did not send its welcome within 500 ms" in done.stderr,
          f"not a timeout naming the socket: {done.stderr}")
    check(seconds < 5, f"status took {seconds:.1f} s with --timeout-ms 500")
    done, _ = c.status(path)
    check(done.returncode == 0, f"the daemon does not serve after SIGCONT: {done.stderr}")


def case_other_uid_refused(c):
    if os.geteuid() != 0:
        print("SKIP: needs root to run a client as uid 65534 (setpriv); CI runs as root")
        return SKIP
    if shutil.which("setpriv") is None:
        print("SKIP: setpriv (util-linux) is not installed")
        return SKIP
    # uid 65534 must reach the socket: the directories 0755, the socket 0666. What refuses it
    # must then be the daemon's SO_PEERCRED check, not the file system.
    os.chmod(c.tmp, 0o755)
    os.mkdir(os.path.join(c.tmp, "run"), 0o755)
    path = c.socket_path()
    _, log = c.start(path, "--set", "daemon.socket_mode=0666", "--metrics-port", "0")
    port = metrics_port(log)
    before = refused(scrape(port))
    done, _ = c.status(path, user=65534)
    check(done.returncode == 1, f"uid 65534 was not refused: {done.stdout}{done.stderr}")
    expected = "refused this client: uid 65534 (gid 65534) may not use this proxyepd"
    check(expected in done.stderr, f"the refusal does not say why: {done.stderr}")
    check("connection refused" not in done.stderr and "ermission denied" not in done.stderr,
          f"refused by the file system, not the credential check: {done.stderr}")
    wait_for(lambda: "(uid 65534, gid 65534): uid 65534 (gid 65534) may not use" in read(log),
             10, "the daemon's log to say why it refused uid 65534")
    check(refused(scrape(port)) - before == 1, "refused did not move by exactly 1")
    done, _ = c.status(path)  # root is still served
    check(done.returncode == 0, f"root was not served: {done.stderr}")


def case_bad_version(c):
    path = c.socket_path()
    c.start(path)
    frames = exchange(path, hello(version=999))
    check(len(frames) == 1 and frames[0]["proxyep"] == "error", f"answer: {frames}")
    error = frames[0]["error"]
    check("999" in error and "version 1" in error, f"the error does not name both: {error}")


def case_attach_refused(c):
    path = c.socket_path()
    c.start(path)
    frames = exchange(path, hello(kind="attach", capabilities=["memfd"]))
    check(len(frames) == 1 and frames[0]["proxyep"] == "error", f"answer: {frames}")
    check("not available yet in this build: the daemon serves status only" in frames[0]["error"],
          f"not the honest error: {frames[0]}")
    frames = exchange(path, hello(kind="dance"))
    check("unknown kind" in frames[0]["error"], f"answer: {frames}")
    frames = exchange(path, {"proxyep": "welcome", "version": 1})
    check("not a proxyep hello" in frames[0]["error"], f"answer: {frames}")


def case_sigterm_drain(c):
    path = c.socket_path()
    drain_ms = 1500
    daemon, log = c.start(path, "--set", f"daemon.drain_timeout_ms={drain_ms}")
    # A connection in progress that never sends its hello holds the drain to its deadline.
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(path)
    check(c.status(path)[0].returncode == 0, "status before the drain failed")
    start = time.monotonic()
    os.kill(daemon.pid, signal.SIGTERM)
    wait_for(lambda: not os.path.exists(path), 5, "the socket file to go at the drain's start")
    done, _ = c.status(path, timeout_ms=3000)
    check(done.returncode == 1 and f"no proxyepd at {path}: no such file" in done.stderr,
          f"a draining daemon still takes connections: {done.stdout}{done.stderr}")
    daemon.wait(timeout=drain_ms / 1000 + 10)
    elapsed = time.monotonic() - start
    check(daemon.returncode == 0, f"proxyepd exited with {daemon.returncode}:\n{read(log)}")
    check(elapsed < drain_ms / 1000 + 5, f"the drain took {elapsed:.1f} s")
    check("SIGTERM: draining" in read(log), f"no drain in the log:\n{read(log)}")
    stalled.settimeout(5)
    check(stalled.recv(16) == b"", "the stalled connection was not closed")
    stalled.close()
    # Without connections in progress the drain ends at once.
    daemon, log = c.start(path)
    start = time.monotonic()
    os.kill(daemon.pid, signal.SIGINT)
    daemon.wait(timeout=10)
    check(daemon.returncode == 0 and not os.path.exists(path), f"SIGINT:\n{read(log)}")
    check(time.monotonic() - start < 3, "an idle daemon took too long to stop")


def case_metrics(c):
    path = c.socket_path()
    # Serves nobody this test runs as: every status query below is a refusal.
    other = 4000000000 if os.getuid() != 4000000000 else 4000000001
    daemon, log = c.start(path, "--metrics-port", "0", "--set", f"daemon.allow_uids={other}",
                          ready=True)
    port = metrics_port(log)
    before = scrape(port)
    check(before[("proxyep_daemon_clients_attached", ())] == 0, "clients_attached")
    check(before[("proxyep_daemon_draining", ())] == 0, "draining")
    check(before[("proxyep_daemon_uptime_seconds", ())] >= 0, "uptime")
    for _ in range(3):
        done, _ = c.status(path)
        check(done.returncode == 1 and "may not use this proxyepd" in done.stderr, done.stderr)
    after = scrape(port)
    check(refused(after) - refused(before) == 3,
          f"refused moved by {refused(after) - refused(before)}, not 3")
    accepted = ("proxyep_daemon_connections_total", (("outcome", "accepted"),))
    check(after[accepted] == before[accepted] == 0, "a refused client was counted as accepted")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proxyepd", required=True)
    parser.add_argument("--proxyep", required=True)
    parser.add_argument("case", choices=sorted(CASES))
    args = parser.parse_args()
    case = Case(args)
    try:
        result = CASES[args.case](case)
        # In sanitizer builds a daemon's report lands in its log, not in this test's output:
        # bring it here (ctest fails a test whose output holds one).
        for _, log in case.daemons:
            check("Sanitizer" not in read(log), f"a sanitizer report in {log}")
    except Failure as e:
        print(f"FAIL: {args.case}: {e}", file=sys.stderr)
        for _, log in case.daemons:
            print(f"--- {log}:\n{read(log)}", file=sys.stderr)
        return 1
    finally:
        case.close()
    if result == SKIP:
        return SKIP
    print(f"ok: {args.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
