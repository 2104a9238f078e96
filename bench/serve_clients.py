"""`builder serve` beside many downloading clients: does a fast client still get answers, and are honest slow
readers left alone? (issue 54 item 4; numbers in docs/RELIABILITY.md, "serve and inputs").

The server runs in its own process with the default limits (512 connections); the readers run in this process on
one selector thread, each reading its body at its own steady rate (a token bucket, checked every 20 ms); the fast
client runs in a third process and fetches ``/simple/demo/`` (a negotiated page) and a 20 KB file every 0.25 s on a
new connection. A reader that gets 503 retries after its ``Retry-After`` (1 s), as an honest client does; one whose
download is cut (a reset, or the connection closed before ``Content-Length`` bytes) is counted as reset.

    .venv/bin/python bench/serve_clients.py slow        # 1000 readers at 16-40 KiB/s, 8 MiB file, 120 s
    .venv/bin/python bench/serve_clients.py downloads   # 520 readers at 100 KiB/s, 64 MiB file, 60 s
    .venv/bin/python bench/serve_clients.py slow --pythonpath /tmp/before   # the same against another checkout

Needs ``ulimit -n`` above 2 × readers + 100.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SCENARIOS = {  # readers, lowest and highest rate (KiB/s), file size (MiB), seconds
    "slow": (1000, 16, 40, 8, 120),
    "downloads": (520, 100, 100, 64, 60),
}

SERVER = """
import sys
from pathlib import Path
from builder.index.serve import make_server
server = make_server(Path(sys.argv[1]), "127.0.0.1", 0, log_stream=open(sys.argv[2], "w"))
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def wheelhouse(root: Path, size_mib: int) -> None:
    page = root / "simple" / "demo"
    page.mkdir(parents=True)
    (page / "index.html").write_text("<html><body><a href='../../wheels/small.whl'>small.whl</a></body></html>\n")
    (page / "index.json").write_text(json.dumps({"meta": {"api-version": "1.0"}, "name": "demo", "files": []}))
    (root / "wheels").mkdir()
    (root / "wheels" / "small.whl").write_bytes(os.urandom(20_000))
    with open(root / "wheels" / "big.whl", "wb") as f:
        f.truncate(size_mib << 20)


@dataclass(eq=False)
class Reader:
    rate: float  # bytes/s
    sock: socket.socket | None = None
    started: float = 0.0
    head: bytes = b""
    length: int = -1
    got: int = 0
    tokens: float = 0.0
    last: float = 0.0
    retry_at: float = 0.0
    outcomes: list[tuple[str, float]] = field(default_factory=list)  # (what, seconds into the download)


def request(port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/html\r\n\r\n".encode()


def run_readers(port: int, readers: list[Reader], seconds: float) -> None:
    sel = selectors.DefaultSelector()
    end = time.monotonic() + seconds

    def start(r: Reader, now: float) -> None:
        r.sock = socket.socket()
        r.sock.setblocking(False)
        try:
            r.sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        r.started, r.head, r.length, r.got, r.tokens, r.last = now, b"", -1, 0, 0.0, now
        r.sent = False  # type: ignore[attr-defined]

    def finish(r: Reader, what: str, now: float) -> None:
        r.outcomes.append((what, now - r.started))
        assert r.sock is not None
        r.sock.close()
        r.sock = None
        r.retry_at = now + (1.0 if what == "503" else 0.0)

    now = time.monotonic()
    for i, r in enumerate(readers):  # spread the connects over the first 2 s
        r.retry_at = now + 2.0 * i / len(readers)
    while (now := time.monotonic()) < end:
        for r in readers:
            if r.sock is None:
                if now >= r.retry_at:
                    start(r, now)
                continue
            if not r.sent:  # type: ignore[attr-defined]
                try:
                    r.sock.send(request(port, "/wheels/big.whl"))
                    r.sent = True  # type: ignore[attr-defined]
                except (BlockingIOError, OSError) as e:
                    if not isinstance(e, BlockingIOError) and now - r.started > 5:
                        finish(r, "connect-failed", now)
                continue
            r.tokens = min(r.tokens + (now - r.last) * r.rate, 256 * 1024)
            r.last = now
            want = int(r.tokens) if r.length >= 0 else 4096
            if want <= 0:
                continue
            try:
                data = r.sock.recv(want)
            except BlockingIOError:
                continue
            except OSError:
                finish(r, "reset", now)
                continue
            if not data:
                finish(r, "reset" if r.length < 0 or r.got < r.length else "done", now)
                continue
            if r.length < 0:
                r.head += data
                if b"\r\n\r\n" not in r.head:
                    continue
                head, _, rest = r.head.partition(b"\r\n\r\n")
                status = head.split(b" ", 2)[1].decode()
                if status != "200":
                    finish(r, status, now)
                    continue
                r.length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                                    if line.lower().startswith(b"content-length")))
                data = rest
            r.tokens -= len(data)
            r.got += len(data)
            if r.got >= r.length:
                finish(r, "done", now)
        time.sleep(0.02)
    sel.close()


def fast_client(port: int, seconds: float) -> None:
    """Runs in its own process: every 0.25 s a page and a small file on new connections; prints JSON lines."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path in ("/simple/demo/", "/wheels/small.whl"):
            t0 = time.monotonic()
            status = "error"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(request(port, path).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
                    data = b""
                    while chunk := s.recv(65536):
                        data += chunk
                    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "empty"
            except OSError as e:
                status = type(e).__name__
            print(json.dumps({"path": path, "status": status, "ms": (time.monotonic() - t0) * 1000}), flush=True)
        time.sleep(0.25)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--pythonpath", default=str(Path(__file__).resolve().parents[1]),
                        help="the checkout whose builder/ serves (default: this one)")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--readers", type=int)
    parser.add_argument("--fast", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    count, low, high, size, seconds = SCENARIOS[args.scenario]
    count, seconds = args.readers or count, args.seconds or seconds
    if args.fast:
        fast_client(args.port, seconds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "wh"
        wheelhouse(root, size)
        log = Path(tmp) / "serve.log"
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(root), str(log)], stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": args.pythonpath}, cwd=tmp)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            rng = random.Random(54)
            readers = [Reader(rate=rng.uniform(low, high) * 1024) for _ in range(count)]
            fast = subprocess.Popen([sys.executable, __file__, args.scenario, "--fast", "--port", str(port),
                                     "--seconds", str(seconds - 5)], stdout=subprocess.PIPE, text=True)
            time.sleep(0)
            run_readers(port, readers, seconds)
            out, _ = fast.communicate()
            log_lines = log.read_text().splitlines()
        finally:
            server.terminate()
            server.wait()
    report(args.scenario, count, low, high, size, seconds, readers, [json.loads(x) for x in out.splitlines()],
           log_lines)
    return 0


def report(scenario: str, count: int, low: int, high: int, size: int, seconds: float, readers: list[Reader],
           fast: list[dict], log_lines: list[str]) -> None:
    outcomes = [o for r in readers for o in r.outcomes]
    kinds: dict[str, int] = {}
    for what, _ in outcomes:
        kinds[what] = kinds.get(what, 0) + 1
    resets = sorted(t for what, t in outcomes if what == "reset")
    print(f"{scenario}: {count} readers at {low}-{high} KiB/s of a {size} MiB file for {seconds:.0f} s")
    print(f"  reader outcomes: {kinds}" + (f"; resets after {resets[0]:.0f}-{resets[-1]:.0f} s" if resets else ""))
    print(f"  readers downloading at the end: {sum(1 for r in readers if r.sock is not None and r.length >= 0)}")
    for path in ("/simple/demo/", "/wheels/small.whl"):
        rows = [f for f in fast if f["path"] == path]
        ok = [f["ms"] for f in rows if f["status"] == "200"]
        statuses: dict[str, int] = {}
        for f in rows:
            statuses[f["status"]] = statuses.get(f["status"], 0) + 1
        line = f"  fast client {path}: {statuses}"
        if ok:
            line += (f"; 200 in median {statistics.median(ok):.1f} ms, p90 "
                     f"{sorted(ok)[int(len(ok) * 0.9)]:.1f} ms, max {max(ok):.1f} ms")
        print(line)
    why: dict[str, int] = {}
    for line in log_lines:
        if '"GET' in line:
            continue
        key = line.split(" - ", 1)[-1]
        key = key.split(":")[0] if "connections open" in key else key
        why[key] = why.get(key, 0) + 1
    print(f"  server log (not requests): {dict(sorted(why.items(), key=lambda kv: -kv[1])[:6])}")


if __name__ == "__main__":
    sys.exit(main())
