"""The watchdog of a multi-process run: heartbeats through jax.distributed's
key-value store, so that when a process dies or fails the others stop within a
bounded time with a message naming the lost process (ptdp_jax.parallel.distributed starts it).
It knows nothing of ptdp_jax.parallel.distributed: `setup` is any object with coordinator,
num_processes and process_id."""
from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
import warnings

from ptdp_jax.exits import ExitCode, short_error as _short

_KEY = "ptdp_watchdog"
EXIT_PEER_LOST = ExitCode.PEER_LOST


class Watchdog:
    """Heartbeats through the coordination service's key-value store (see module doc).

    Keys: <_KEY>/beat/<i> (a counter), <_KEY>/host/<i> ("host (pid N)"),
    <_KEY>/state/<i> ("done" or "failed: why")."""

    def __init__(self, client, setup, timeout: float):
        self.client, self.setup, self.timeout = client, setup, float(timeout)
        self.me, self.n = setup.process_id, setup.num_processes
        self.interval = max(0.05, min(1.0, self.timeout / 10))
        self._stop = threading.Event()
        self._marked = False
        self._losing = threading.Lock()
        self._uncaught: BaseException | None = None
        self.hosts: dict[int, str] = {}
        self.thread = threading.Thread(target=self._run, name="ptdp-watchdog", daemon=True)

    @classmethod
    def start(cls, setup, timeout: float) -> "Watchdog | None":
        from jax._src.distributed import global_state
        client = getattr(global_state, "client", None)
        if client is None or not hasattr(client, "key_value_dir_get"):
            warnings.warn("ptdp_jax: no jax.distributed client to run the peer watchdog on; a "
                          "lost process is reported by JAX's own heartbeat check only")
            return None
        w = cls(client, setup, timeout)
        client.key_value_set(f"{_KEY}/host/{w.me}", f"{socket.gethostname()} (pid {os.getpid()})",
                             allow_overwrite=True)
        client.key_value_set(f"{_KEY}/beat/{w.me}", "0", allow_overwrite=True)
        previous_hook = sys.excepthook

        def hook(tp, value, tb):
            w._uncaught = value
            if w.me != 0 and _looks_like_lost_peer(value) and not w._coordinator_alive():
                # Process 0 is gone; JAX ends this process any moment now: say it first.
                print(f"{tp.__name__}: {_short(value)}", file=sys.stderr, flush=True)
                w._lost(f"lost {w._who(0)}, which runs the coordination service at "
                        f"{w.setup.coordinator} (it died, was killed, or its host is unreachable)")
            previous_hook(tp, value, tb)

        sys.excepthook = hook
        atexit.register(w._at_exit)
        w.thread.start()
        return w

    def _dir(self, sub: str) -> dict[int, str]:
        out = {}
        for key, value in self.client.key_value_dir_get(f"{_KEY}/{sub}/"):
            tail = key.rsplit("/", 1)[-1]
            if tail.isdigit():
                out[int(tail)] = value
        return out

    def _coordinator_alive(self) -> bool:
        try:
            self.client.key_value_try_get(f"{_KEY}/host/0")
            return True
        except Exception as e:
            return "unavailable" not in str(e).lower() and "socket" not in str(e).lower()

    def _who(self, k: int) -> str:
        if k not in self.hosts and not self._stop.is_set():
            try:
                self.hosts.update(self._dir("host"))
            except Exception:
                pass
        where = self.hosts.get(k)
        return f"process {k} of {self.n}" + (f" on {where}" if where else "")

    def _run(self):
        beat = 0
        start = time.monotonic()
        seen: dict[int, tuple[str, float]] = {}
        while not self._stop.wait(self.interval):
            beat += 1
            try:
                self.client.key_value_set(f"{_KEY}/beat/{self.me}", str(beat), allow_overwrite=True)
                beats, states = self._dir("beat"), self._dir("state")
                if len(self.hosts) < self.n:         # known before anyone is lost
                    self.hosts.update(self._dir("host"))
            except Exception as e:
                if self._stop.is_set():
                    return
                self._lost(f"lost {self._who(0)}, which runs the coordination service at "
                           f"{self.setup.coordinator} (it died or is unreachable: "
                           f"{type(e).__name__}: {_short(e, 200)})")
                return
            now = time.monotonic()
            for k in range(self.n):
                if k == self.me:
                    continue
                state = states.get(k, "")
                if state.startswith("failed"):
                    self._lost(f"{self._who(k)} failed ({state[len('failed'):].lstrip(': ')})")
                    return
                if state == "done":
                    continue
                b, prev = beats.get(k), seen.get(k)
                if prev is None or prev[0] != b:           # new beat (or none yet: since start)
                    seen[k] = (b, start if prev is None and b is None else now)
                elif now - prev[1] > self.timeout:
                    self._lost(f"lost {self._who(k)}: no heartbeat for {now - prev[1]:.0f} s "
                               f"(it died, was killed, or its host is unreachable)")
                    return

    def _lost(self, why: str):
        if self._stop.is_set() or not self._losing.acquire(blocking=False):
            return
        print(f"ptdp-train: process {self.me}: {why}; stopping this process too (exit code "
              f"{EXIT_PEER_LOST}). Restart all {self.n} processes to resume from the last "
              f"complete checkpoint.", file=sys.stderr, flush=True)
        sys.stdout.flush()
        self._mark(f"failed: {why}")
        os._exit(EXIT_PEER_LOST)

    def _mark(self, state: str) -> None:
        if self._marked:
            return
        self._marked = True
        try:
            self.client.key_value_set(f"{_KEY}/state/{self.me}", state, allow_overwrite=True)
        except Exception:
            pass

    def finish(self, ok: bool, why: str = "") -> None:
        """This process is done (ok) or failed: stop beating, tell the others. A failed
        process then exits at once with code 1 (the others stop too) instead of waiting in
        jax.distributed's shutdown for peers that are still training."""
        self._stop.set()
        self._mark("done" if ok else f"failed: {why or 'exited with an error'}")
        if not ok:
            sys.stdout.flush()
            sys.stderr.flush()
            if self.me == 0:                    # let the others read it before the service goes
                time.sleep(min(5.0, 3 * self.interval + 0.5))

    def stop(self) -> None:
        """Stop beating and wait for the thread: no key-value calls once this returns."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5 * self.interval + 1)

    def _at_exit(self):
        if self._marked:
            return
        exc = self._uncaught
        if exc is not None:
            if _looks_like_lost_peer(exc) and self.thread.is_alive():
                # A collective failed: most likely a peer died. Give the watchdog the time to
                # tell which one (it exits with EXIT_PEER_LOST and names it).
                print(f"ptdp-train: process {self.me}: a cross-process operation failed; "
                      f"checking for up to {self.timeout + 3 * self.interval:.0f} s whether "
                      f"another process was lost", file=sys.stderr, flush=True)
                self.thread.join(self.timeout + 3 * self.interval)
            self.finish(False, f"{type(exc).__name__}: {_short(exc, 200)}")
            os._exit(1)
        self.finish(True)


def _looks_like_lost_peer(exc: BaseException) -> bool:
    """A runtime error of a collective or of the coordination service (gloo/NCCL/gRPC)."""
    seen = 0
    while exc is not None and seen < 10:
        text = f"{type(exc).__name__} {exc}".lower()
        if "runtimeerror" in text and any(w in text for w in (
                "gloo", "nccl", "connection", "socket", "peer", "unavailable", "deadline",
                "timed out", "barrier", "coordination")):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
