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
import re
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
        self.attach_client = args.attach_client
        self.ep_buffer = args.ep_buffer
        self.ep_device_buffer = args.ep_device_buffer
        self.tmp = tempfile.mkdtemp(prefix="proxyepd-test-")
        self.daemons = []  # (Popen, log path)

    def close(self):
        for process, _ in self.daemons:
            end_process(process)
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


def end_process(process):
    """Kills `process` (a Popen this case started, by its pid) unless it has ended, and reaps it."""
    if process.poll() is None:
        process.kill()
        process.wait()


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


def attach_answer(path, request):
    """The daemon's frames after an attach hello and `request` (no descriptors), up to the end
    of the connection (a refused request ends it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(frame(hello(kind="attach")))
        data = b""
        while not parse_frames(data):
            data += s.recv(65536)
        welcome = parse_frames(data)[0]
        check(welcome["proxyep"] == "welcome" and "attach" in welcome["capabilities"],
              f"welcome: {welcome}")
        s.sendall(frame(request))
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return parse_frames(data)[1:]


def case_attach_protocol(c):
    path = c.socket_path()
    c.start(path)
    # An attach hello is welcomed; an attach request without its memory is refused, saying why.
    frames = attach_answer(path, {"proxyep": "attach", "rank": 0, "ranks": 2})
    check(frames and frames[-1]["proxyep"] == "error", f"answer: {frames}")
    check("carried 0 file descriptors, 5 expected" in frames[-1]["error"], f"not why: {frames}")
    # Device memory offered without its handle: refused before anything is mapped.
    frames = attach_answer(path, {"proxyep": "attach", "rank": 0, "ranks": 2,
                                  "device_memory": {"kind": "cuda", "staging": {"bytes": 4096}}})
    check(frames and "'device_memory.staging' needs a hex 'handle'" in frames[-1].get("error", ""),
          f"answer: {frames}")
    # Captured steps' memory before any attach: refused (a client attached and started first).
    frames = attach_answer(path, {"proxyep": "step_memory", "bytes": 4096})
    check(frames and "'step_memory' before 'start'" in frames[-1].get("error", ""),
          f"answer: {frames}")
    frames = exchange(path, hello(kind="dance"))
    check("unknown kind" in frames[0]["error"], f"answer: {frames}")
    frames = exchange(path, {"proxyep": "welcome", "version": 1})
    check("not a proxyep hello" in frames[0]["error"], f"answer: {frames}")
    check(c.status(path)[0].returncode == 0, "the daemon does not serve status any more")


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


# --- the data path: ranks whose proxy is the daemon ---------------------------------------


def start_nodes(c, nodes=2, provider="tcp"):
    """One daemon per emulated node (`provider` with the reorder shim), and the environment that
    sends ranks to them: daemon.socket with {node}, which each rank turns into its node's
    index."""
    os.environ.update(PROXYEP_FABRIC_PROVIDER=provider, PROXYEP_FABRIC_REORDER="1")
    paths = [c.socket_path(f"run/node{n}.sock") for n in range(nodes)]
    daemons = [c.start(path) for path in paths]
    env = dict(os.environ, PROXYEP_PROXY_MODE="daemon", PROXYEP_LOG_LEVEL="warn",
               PROXYEP_DAEMON_SOCKET=c.socket_path("run/node{node}.sock"),
               PROXYEP_EP_TIMEOUT_MS="20000")
    return paths, daemons, env


def status_json(c, path):
    done, _ = c.status(path, "--json")
    check(done.returncode == 0, f"status of {path} failed: {done.stderr}")
    return json.loads(done.stdout)


def attached(c, path):
    return status_json(c, path)["clients_attached"]


def bench(c, kind, env, *extra, ranks=4, per_node=2, wait=True):
    command = [c.proxyep, "bench", kind, "--ranks", str(ranks), "--ranks-per-node",
               str(per_node), "--reorder", *extra]
    if kind == "ep":
        command += ["--tokens", "128", "--hidden", "512", "--warmup", "1", "--no-floor"]
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def check_served(c, paths, daemons, ranks, per_node):
    for node, (_, log) in enumerate(daemons):
        for r in range(node * per_node, (node + 1) * per_node):
            check(f"serves rank {r} of {ranks}" in read(log),
                  f"{paths[node]} did not serve rank {r}")
    for path in paths:  # every rank detached, on every daemon
        wait_for(lambda: attached(c, path) == 0, 10, f"{path} to have no client attached")


def case_daemon_bench_ep(c):
    """bench ep through the daemons, 2 nodes x 2 (hierarchical internode), with host tensors and
    then with device tensors on a simulated device (forwarding and the in-node reduce on its
    stream)."""
    paths, daemons, env = start_nodes(c)
    for extra in ((), ("--device", "simulated")):
        done = bench(c, "ep", env, "--iters", "3", *extra)
        check(done.returncode == 0 and "verified: yes" in done.stdout
              and "ep.internode hierarchical" in done.stdout,
              f"bench ep {extra} through the daemons failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        check_served(c, paths, daemons, 4, 2)


def case_daemon_bench_ll(c):
    paths, daemons, env = start_nodes(c)
    done = bench(c, "ll", env, "--iters", "5")
    check(done.returncode == 0 and "verified: yes" in done.stdout,
          f"bench ll through the daemons failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    check_served(c, paths, daemons, 4, 2)


def rank_pids(launcher_pid):
    """{rank: pid} of the rank processes a `proxyep bench` launcher started."""
    ranks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            ranks[int(env[b"RANK"])] = int(entry)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return ranks


def stop_job(job):
    """Ends a `proxyep bench` job and its ranks: SIGTERM to the launcher (which stops its ranks),
    then SIGKILL to whatever is left, each by its pid."""
    if job.poll() is None:
        ranks = rank_pids(job.pid)
        job.terminate()
        try:
            job.wait(timeout=15)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def kill_a_client_mid_call(c, provider="tcp", extra=()):
    """Two jobs of 2 ranks through two daemons (`provider`, bench ep `extra`); job A's rank 1 is
    killed mid-call: job A fails naming it, job B on the same daemons runs to the end, and the
    daemons let go of every client. Returns the daemons."""
    paths, daemons, env = start_nodes(c, provider=provider)
    job_a = bench(c, "ep", env, "--iters", "100000", *extra, ranks=2, per_node=1, wait=False)
    job_b = bench(c, "ep", env, "--iters", "400", *extra, ranks=2, per_node=1, wait=False)
    try:
        for path in paths:
            wait_for(lambda: attached(c, path) == 2, 60, f"both jobs to attach to {path}")
        pids = wait_for(lambda: len(rank_pids(job_a.pid)) == 2 and rank_pids(job_a.pid), 10,
                        "job A's ranks")
        os.kill(pids[1], signal.SIGKILL)  # mid-call: job A runs calls back to back
        out_a, _ = job_a.communicate(timeout=60)
        check(job_a.returncode != 0, "job A did not fail after its rank 1 was killed")
        check("rank 1" in out_a, f"job A's failure does not name rank 1:\n{out_a}")
        out_b, _ = job_b.communicate(timeout=120)
        check(job_b.returncode == 0 and "verified: yes" in out_b,
              f"job B, on the same daemons, did not finish ({job_b.returncode}):\n{out_b}")
    finally:
        for job in (job_a, job_b):
            stop_job(job)
    for path in paths:
        wait_for(lambda: attached(c, path) == 0, 10, f"{path} to let go of every client")
    return daemons


def case_daemon_client_killed(c):
    daemons = kill_a_client_mid_call(c)
    check(any("disconnected" in read(log) for _, log in daemons), "no daemon logged the loss")


def case_daemon_device_client_killed(c):
    """The same while the daemons hold the clients' device memory registered (shm, FI_HMEM;
    simulated devices whose memory a NIC reads): the daemon's own mappings keep the killed
    client's pages until its proxy threads stopped."""
    daemons = kill_a_client_mid_call(c, "shm", ("--device", "simulated"))
    # The device memory was registered (not left to the host bounce) where shm can.
    hmem = registers_device_memory(c, "shm")
    for _, log in daemons:
        check(("not registered" in read(log)) != hmem,
              f"device memory {'left unused' if hmem else 'registered without FI_HMEM'}:\n"
              f"{read(log)}")


def case_daemon_killed(c):
    paths, daemons, env = start_nodes(c)
    job = bench(c, "ep", env, "--iters", "100000", ranks=2, per_node=1, wait=False)
    try:
        for path in paths:
            wait_for(lambda: attached(c, path) == 1, 60, f"the job to attach to {path}")
        daemons[1][0].kill()
        start = time.monotonic()
        out, _ = job.communicate(timeout=60)
        seconds = time.monotonic() - start
    finally:
        stop_job(job)
    check(job.returncode != 0, "the job did not fail when its node's daemon died")
    # Whichever rank notices first fails the job: rank 1 names its dead daemon, rank 0 (whose
    # daemon's writes to rank 1 break) names the rank it lost; the launcher then stops the other.
    check(f"proxyepd at {paths[1]}" in out or re.search(r"write to rank 1 .* failed", out),
          f"the failure names neither the daemon nor the rank behind it:\n{out}")
    check(seconds < 15, f"the job took {seconds:.1f} s to fail (ep.timeout_ms 20000)")
    # A restarted daemon serves new clients.
    os.unlink(paths[1]) if os.path.exists(paths[1]) else None
    c.start(paths[1])
    done = bench(c, "ep", env, "--iters", "2", ranks=2, per_node=1)
    check(done.returncode == 0 and "verified: yes" in done.stdout,
          f"a job after the restart failed:\n{done.stdout}{done.stderr}")


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS:")).split()[1])


def case_daemon_ep_buffer(c):
    """The Buffer's own end-to-end checks (tests/integration/ep_buffer.cpp: every case against
    the reference, bad input, stats) with the proxy in the daemons; with one rank per node its
    rows from the other node land in recv_x through the landing region the daemon registered."""
    paths, daemons, env = start_nodes(c)
    done = subprocess.run([c.proxyep, "launch", "-n", "2", "--timeout", "90", "--", c.ep_buffer,
                           "--ranks-per-node", "1", "--seed", "3"],
                          env=env, capture_output=True, text=True, timeout=120)
    check(done.returncode == 0 and "all cases OK" in done.stdout,
          f"ep_buffer through the daemons failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    check_served(c, paths, daemons, 2, 1)


def case_daemon_elastic(c):
    """DeepEP V2's ElasticBuffer with its proxies in the daemons: test_elastic.py's V2 combine
    orders and expanded layout as ranks in daemon mode, 2 nodes x 2 (hybrid: the forwarders'
    in-node orders cross the daemons' fabric)."""
    paths, daemons, env = start_nodes(c)
    build = os.path.dirname(os.path.dirname(os.path.abspath(c.proxyep)))
    tests = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    env = dict(env, PYTHONPATH=f"{build}/python:{tests}",
               PYTEST_ADDOPTS="-k 'combine_in_v2_order or expanded'")  # pytest splits it as a shell would
    done = subprocess.run([c.proxyep, "launch", "-n", "4", "--ranks-per-node", "2", "--timeout", "90",
                           "--", "/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(tests, "test_elastic.py")],
                          env=env, capture_output=True, text=True, timeout=120)
    check(done.returncode == 0 and " passed" in done.stdout and "failed" not in done.stdout,
          f"test_elastic.py through the daemons failed ({done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
    check_served(c, paths, daemons, 4, 2)


def run_device_cases(c, env):
    """The device Buffer cases of ep_device_buffer, each as a job of 2 ranks on 2 nodes."""
    for case in ("normal mode with device tensors and eager rows",
                 "normal mode with device tensors in many chunks",
                 "low-latency mode with device tensors",
                 "low-latency calls captured into graphs",
                 "low-latency calls captured into graphs with hooks in the caller's capture"):
        done = subprocess.run([c.proxyep, "launch", "-n", "2", "--timeout", "90", "--",
                               c.ep_device_buffer, "-tc=" + case],
                              env=env, capture_output=True, text=True, timeout=120)
        check(done.returncode == 0 and done.stdout.count("test cases: 1 | 1 passed") == 2,
              f"{case} through the daemons failed ({done.returncode}):\n"
              f"{done.stdout}{done.stderr}")


def check_steps_linked(daemons, memory):
    """Every daemon linked its client's captured steps (proxy/session/proxy_host_daemon.hpp: the step ring,
    memory and signal words; the daemon counts the words), with the step memory in `memory`
    ("device memory" or "host memory")."""
    for _, log in daemons:
        text = read(log)
        check("captured steps linked" in text and f"step memory in {memory}" in text,
              f"a daemon did not link captured steps with the step memory in {memory}:\n{text}")


def case_daemon_device_buffer(c):
    """Device tensors through the daemons (tests/integration/ep_device_buffer.cpp on a
    simulated device): normal mode with eager rows and in many chunks, low-latency mode, and
    low-latency calls captured into graphs; the device's stream pushes the writes to other nodes
    into the ring the daemon drains (each case checks that some went that way); a captured step
    pushes into the step ring, and its writes land in host step memory (tcp registers no device
    memory), counted in signal words by the daemon. One rank's stream is slow, the other's runs
    only when waited for."""
    paths, daemons, env = start_nodes(c)
    run_device_cases(c, env)
    check_served(c, paths, daemons, 2, 1)
    check_steps_linked(daemons, "host memory")


def registers_device_memory(c, provider):
    """Whether `provider` announces FI_HMEM here (`proxyep info`: shm does in a build with CUDA,
    whose fabric layer asks for it)."""
    done = subprocess.run([c.proxyep, "info", "--provider", provider, "--json"],
                          capture_output=True, text=True, timeout=60)
    check(done.returncode == 0, f"proxyep info failed: {done.stderr}")
    return any(p.get("hmem") for p in json.loads(done.stdout)["providers"])


def case_daemon_device_memory(c):
    """Device memory the daemons' NIC reads and writes (GPUDirect RDMA through proxyepd): over
    shm, which registers device memory (FI_HMEM) in a build with CUDA, each rank offers its
    daemon the handles of its device staging and device arena (simulated devices whose memory a
    NIC reads, their memfds passed beside); the daemon opens and registers them, so chunks to
    the other node leave from device staging and its rows land in the device arena (each case
    checks both happened), and captured steps land in device step memory the daemon opened by
    its handle. Where shm announces no FI_HMEM, the daemon declines and the cases check that the
    host bounce served instead, with the same results."""
    paths, daemons, env = start_nodes(c, provider="shm")
    hmem = registers_device_memory(c, "shm")
    env["PROXYEP_TEST_NIC_DEVICE_MEMORY"] = "1" if hmem else "declined"
    run_device_cases(c, env)
    check_served(c, paths, daemons, 2, 1)
    check_steps_linked(daemons, "device memory" if hmem else "host memory")


def case_daemon_metrics(c):
    """The daemon's endpoint shows the proxy threads of every rank it serves, labelled by rank
    and pid, and their counters move while a job runs through it; the job's device memory (a
    simulated device whose memory a NIC reads) shows as registered where shm announces FI_HMEM,
    else as offered and declined."""
    os.environ.update(PROXYEP_FABRIC_PROVIDER="shm", PROXYEP_FABRIC_REORDER="1")
    paths = [c.socket_path(f"run/node{n}.sock") for n in range(2)]
    _, log = c.start(paths[0], "--metrics-port", "0")
    c.start(paths[1])
    port = metrics_port(log)
    env = dict(os.environ, PROXYEP_PROXY_MODE="daemon", PROXYEP_LOG_LEVEL="warn",
               PROXYEP_DAEMON_SOCKET=c.socket_path("run/node{node}.sock"),
               PROXYEP_EP_TIMEOUT_MS="20000")
    job = bench(c, "ep", env, "--iters", "100000", "--device", "simulated", ranks=2, per_node=1,
                wait=False)
    hmem = registers_device_memory(c, "shm")
    try:
        wait_for(lambda: scrape(port)[("proxyep_daemon_clients_attached", ())] == 1, 60,
                 "the job's rank 0 to attach")
        pid = str(wait_for(lambda: rank_pids(job.pid).get(0), 10, "rank 0's pid"))

        def sample(name, **labels):
            key = (name, tuple(sorted({"thread": "0", "rank": "0", "pid": pid, **labels}.items())))
            return scrape(port).get(key)

        first = wait_for(lambda: (sample("proxyep_proxy_descriptors_total") or 0) > 0 and
                         sample("proxyep_proxy_descriptors_total"), 30, "descriptors to count")
        wait_for(lambda: sample("proxyep_proxy_descriptors_total") > first, 30,
                 "the descriptor counter to move while the job runs")
        check(sample("proxyep_proxy_write_latency_seconds_count") > 0, "no write latency sample")
        check(sample("proxyep_proxy_completions_total", side="remote") > 0,
              "no remote completion counted (immediates the daemon relays)")
        check(sample("proxyep_proxy_cq_errors_total") == 0, "CQ errors on a healthy job")
        for memory in ("staging", "arena"):
            key = ("proxyep_daemon_device_memory_registered",
                   tuple(sorted({"rank": "0", "pid": pid, "memory": memory}.items())))
            check(scrape(port).get(key) == (1 if hmem else 0),
                  f"device {memory}: {scrape(port).get(key)} (FI_HMEM: {hmem})")
    finally:
        stop_job(job)
    wait_for(lambda: scrape(port)[("proxyep_daemon_clients_attached", ())] == 0, 30,
             "the killed job's rank to be let go")
    check(not any(name.startswith("proxyep_proxy_") or name.startswith("proxyep_daemon_device")
                  for name, _ in scrape(port)),
          "a rank let go still has proxy or device memory samples")


def case_daemon_crash_cycles(c):
    path = c.socket_path()
    os.environ.update(PROXYEP_FABRIC_PROVIDER="tcp", PROXYEP_FABRIC_REORDER="1")
    daemon, _ = c.start(path)
    fresh = rss_kib(daemon.pid)

    def cycle(end):
        done = subprocess.run([c.attach_client, "--socket", path, "--end", end],
                              capture_output=True, text=True, timeout=30)
        check("started" in done.stdout, f"attach_client --end {end}: {done.stdout}{done.stderr}")

    def settled():
        return attached(c, path) == 0

    for _ in range(5):  # warm: the allocator's and the provider's first-use state
        cycle("detach")
    wait_for(settled, 10, "the warm-up clients to go")
    fds, rss = fd_count(daemon.pid), rss_kib(daemon.pid)
    # A client's fabric is tens of MiB of heap: the daemon hands it back when the client goes
    # (malloc_trim), not only keeps it for the next one.
    check(rss - fresh < 32 * 1024,
          f"the daemon holds {rss - fresh} KiB more than before its first client, none attached")
    for i in range(100):
        cycle("kill" if i % 2 else "exit")
    wait_for(settled, 10, "the crashed clients to go")
    wait_for(lambda: fd_count(daemon.pid) == fds, 10,
             f"the daemon's file descriptors to return to {fds} (now {fd_count(daemon.pid)})")
    grown = rss_kib(daemon.pid) - rss
    check(grown < 16 * 1024, f"the daemon's RSS grew by {grown} KiB over 100 crashed clients")
    print(f"100 crash cycles: fds {fds} -> {fd_count(daemon.pid)}, RSS {rss} -> "
          f"{rss_kib(daemon.pid)} KiB")


def case_daemon_isolation(c):
    path = c.socket_path()
    os.environ.update(PROXYEP_FABRIC_PROVIDER="tcp")
    c.start(path)
    holder = subprocess.Popen([c.attach_client, "--socket", path, "--end", "hold"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        check(line.startswith("address "), f"the first client said {line!r}")
        victim = line.split()[1]
        check(holder.stdout.readline().startswith("arena "), "the first client printed no arena")
        check(holder.stdout.readline().strip() == "started", "the first client did not start")
        intruder = subprocess.run([c.attach_client, "--socket", path, "--peer", victim],
                                  capture_output=True, text=True, timeout=30)
        check(intruder.returncode == 2, f"a client naming another job's rank was served")
        check("of another job on this daemon" in intruder.stderr,
              f"the refusal does not say why: {intruder.stderr}")
        holder.stdin.close()
        check(holder.wait(timeout=30) == 0, "the first client could not detach after the refusal")
    finally:
        end_process(holder)


JOB_A = "a" * 64  # job tags as control::daemon_job_tag writes them (an HMAC in hex)
JOB_B = "b" * 64


def attach_client_run(c, path, *args):
    """Runs attach_client to the end: (exit code, stdout, stderr)."""
    done = subprocess.run([c.attach_client, "--socket", path, *args], capture_output=True,
                          text=True, timeout=30)
    return done.returncode, done.stdout, done.stderr


def served_after_refusal(c, path):
    """A client of a well-behaved job is served after a refusal: the daemon went on."""
    code, out, err = attach_client_run(c, path, "--job-tag", JOB_A)
    check(code == 0 and "started" in out, f"the next client was not served: {err}")


def case_daemon_isolation_race(c):
    """A job's rank is bound to the job from its attach on: another job (another tag) that names
    the rank's endpoint before the rank has connected is refused, and the rank then runs."""
    path = c.socket_path()
    os.environ.update(PROXYEP_FABRIC_PROVIDER="tcp")
    c.start(path)
    victim = subprocess.Popen([c.attach_client, "--socket", path, "--job-tag", JOB_A,
                               "--pause-after-open", "--end", "hold"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = victim.stdout.readline()
        check(line.startswith("address "), f"the victim said {line!r}")
        address = line.split()[1]
        # The victim has its endpoint but has not connected: the intruder comes first.
        code, _, err = attach_client_run(c, path, "--job-tag", JOB_B, "--peer", address)
        check(code == 2, "a client of another job named a rank before it connected and was served")
        check("of another job on this daemon" in err and "credentials differ" in err,
              f"the refusal does not say why: {err}")
        # A client of no job at all (no tag) is refused as well.
        code, _, err = attach_client_run(c, path, "--peer", address)
        check(code == 2 and "of another job on this daemon" in err,
              f"an untagged client named a tagged job's rank: {code} {err}")
        victim.stdin.write("go\n")
        victim.stdin.flush()
        check(victim.stdout.readline().startswith("arena "), "the victim printed no arena")
        line = victim.stdout.readline().strip()
        check(line == "started", f"the victim did not start after the refusal: {line!r}")
        victim.stdin.close()
        check(victim.wait(timeout=30) == 0, f"the victim failed: {victim.stderr.read()}")
    finally:
        end_process(victim)


def case_daemon_bad_descriptors(c):
    """Malformed requests and region descriptors are refused, naming what is wrong, before
    anything is registered; the daemon serves the next client."""
    path = c.socket_path()
    os.environ.update(PROXYEP_FABRIC_PROVIDER="tcp")
    c.start(path)
    # A first client, held: its arena descriptor is what a second one tries to claim.
    holder = subprocess.Popen([c.attach_client, "--socket", path, "--job-tag", JOB_A,
                               "--end", "hold"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        check(holder.stdout.readline().startswith("address "), "the holder printed no address")
        other_arena = holder.stdout.readline().split()[1]
        check(holder.stdout.readline().strip() == "started", "the holder did not start")
        cases = [
            (["--job-tag", "xyz"], "'job_tag' must be 64 lower-case hex digits"),
            (["--descriptors", "zz,own"], "descriptors"),
            (["--descriptors", "own,00ff"], "rank 1's arena descriptor is malformed"),
            (["--descriptors", "00ff,own"],
             "rank 0's arena descriptor is not the one registered for it here"),
            # Another client's arena as its own: writes aimed at memory it was not given.
            (["--descriptors", f"{other_arena},own"],
             "rank 0's arena descriptor is not the one registered for it here"),
            (["--descriptors", "own,"], "rank 1's arena descriptor is empty"),
        ]
        for args, expected in cases:
            code, _, err = attach_client_run(c, path, *args)
            check(code == 2 and expected in err,
                  f"attach_client {' '.join(args)}: exit {code}, expected {expected!r} in: {err}")
            served_after_refusal(c, path)
        holder.stdin.close()
        check(holder.wait(timeout=30) == 0, "the holder could not detach after the refusals")
    finally:
        end_process(holder)


def case_stale_shm_swept(c):
    """proxyepd sweeps, as it starts, the shm regions dead processes left on the node (libfabric's
    shm provider names them "<pid>:..." in /dev/shm): one nobody maps goes, one a live process
    still maps stays (fabric/shm_stale.hpp)."""
    gone = subprocess.Popen(["true"])
    # Exited but not reaped until the end: a zombie names no running process and keeps its pid
    # from reuse (a reaped pid may be handed to a parallel test's process before the sweep).
    os.waitid(os.P_PID, gone.pid, os.WEXITED | os.WNOWAIT)
    leftover = f"/dev/shm/{gone.pid}:0:0"
    mapped = f"/dev/shm/{gone.pid}:1:0"
    # The peer that still maps `mapped`: a child that opens and maps it, says so, and waits.
    peer = subprocess.Popen(
        ["/usr/bin/python3", "-c",
         "import mmap, os, sys\n"
         "fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)\n"
         "os.ftruncate(fd, 4096)\n"
         "m = mmap.mmap(fd, 4096)\n"
         "os.close(fd)\n"
         "print('mapped', flush=True)\n"
         "sys.stdin.read()\n", mapped],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with open(leftover, "wb") as f:
            f.write(b"\0" * 4096)
        check(peer.stdout.readline().strip() == "mapped", "the peer did not map its region")
        _, log = c.start(c.socket_path())
        check(not os.path.exists(leftover), f"proxyepd left {leftover} (nobody maps it)")
        check(f"removed {leftover}" in read(log), f"the daemon's log does not name {leftover}")
        check(os.path.exists(mapped), f"proxyepd removed {mapped}, which a live process maps")
    finally:
        peer.stdin.close()
        peer.wait(timeout=10)
        gone.wait()
        for path in (leftover, mapped):
            if os.path.exists(path):
                os.unlink(path)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proxyepd", required=True)
    parser.add_argument("--proxyep", required=True)
    parser.add_argument("--attach-client")
    parser.add_argument("--ep-buffer")
    parser.add_argument("--ep-device-buffer")
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
