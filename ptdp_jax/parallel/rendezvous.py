"""The meeting of all processes of a multi-process run before jax.distributed starts
(`ptdp_jax.parallel.distributed.maybe_initialize` calls it): over plain TCP on the coordinator's port,
so that a missing peer is a DistributedError naming it, not jax.distributed's abort in C++.
It knows nothing of ptdp_jax.parallel.distributed: `setup` is any object with coordinator,
num_processes, process_id and source."""
from __future__ import annotations


class DistributedError(RuntimeError):
    """jax.distributed could not be started (peers missing, coordinator unreachable)."""


_HELLO = b"ptdp-rendezvous"


def rendezvous(setup, timeout: float) -> None:
    """Wait until every process of `setup` is up, before jax.distributed starts.

    jax.distributed's client aborts the whole process in C++ (exit 134, no Python
    exception) when its peers do not all connect in time. So the processes first meet
    on the coordinator's port over plain TCP: process 0 listens there and waits for the
    others; each other process connects (retrying until `timeout`) and says who it is;
    when all are in, process 0 answers every one of them and closes the port, which
    jax.distributed's service then takes. Whoever waits longer than `timeout` raises
    DistributedError naming the processes that did not come."""
    meeting = _Meeting(setup, timeout)
    if setup.process_id == 0:
        _host(meeting)
    else:
        _join(meeting)


class _Meeting:
    """Who meets where, and until when; `fail` raises the DistributedError that says so."""

    def __init__(self, setup, timeout: float):
        import time
        host, port = setup.coordinator.rsplit(":", 1)
        self.host, self.port = host.strip("[]"), int(port)
        self.me, self.n, self.timeout = setup.process_id, setup.num_processes, timeout
        self.coordinator = setup.coordinator
        self.deadline = time.monotonic() + timeout
        self.where = (f"coordinator {setup.coordinator}, process {self.me} of {self.n}, "
                      f"from {setup.source}")

    def left(self) -> float:
        import time
        return max(0.0, self.deadline - time.monotonic())

    def error(self, what: str) -> DistributedError:
        return DistributedError(f"jax.distributed could not start ({self.where}): {what}")

    def fail(self, what: str):
        raise self.error(f"{what} within {self.timeout:g} s (--init-timeout / PTDP_INIT_TIMEOUT); "
                         f"start all {self.n} processes with the same --coordinator and "
                         f"--num-processes")


def _host(mt: _Meeting) -> None:
    """Process 0: listen on the port until every other process has said hello, answer them
    all, then free the port."""
    import socket
    srv = socket.socket(socket.AF_INET6 if ":" in mt.host else socket.AF_INET)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind(("", mt.port))
    except OSError as e:
        srv.close()
        raise mt.error(f"cannot listen on port {mt.port}: {e}") from None
    srv.listen(mt.n)
    peers: dict[int, object] = {}
    pending: list = []
    try:
        _gather(mt, srv, peers, pending)
        for sock in peers.values():
            sock.sendall(b"go\n")
        for sock in peers.values():              # they close first: the port is free after
            sock.settimeout(5)
            try:
                sock.recv(16)
            except OSError:
                pass
    finally:
        for sock in list(peers.values()) + pending:
            sock.close()
        srv.close()


def _gather(mt: _Meeting, srv, peers: dict, pending: list) -> None:
    """Accept connections and read their hellos until n - 1 processes are in `peers`."""
    import select
    while len(peers) < mt.n - 1:
        ready, _, _ = select.select([srv] + pending, [], [], min(0.5, mt.left()))
        if not ready and not mt.left():
            missing = sorted(set(range(1, mt.n)) - set(peers))
            mt.fail(f"process{'es' if len(missing) > 1 else ''} "
                    f"{', '.join(map(str, missing))} did not connect")
        for sock in ready:
            if sock is srv:
                pending.append(srv.accept()[0])
                continue
            pending.remove(sock)
            pid = _hello(mt, sock, peers)
            if pid is not None:
                peers[pid] = sock


def _hello(mt: _Meeting, sock, peers: dict) -> int | None:
    """The process id a connection says hello with; None (closed) for a stranger (a port
    scan); DistributedError for a wrong --num-processes or a repeated --process-id."""
    try:
        msg = sock.recv(256).decode(errors="replace").split()
    except OSError:
        msg = []
    if len(msg) != 3 or msg[0] != _HELLO.decode():
        sock.close()
        return None
    pid, count = int(msg[1]), int(msg[2])
    if count != mt.n:
        sock.close()
        raise mt.error(f"process {pid} says --num-processes {count}")
    if pid in peers or not 0 < pid < mt.n:
        sock.close()
        raise mt.error(f"two processes say --process-id {pid}")
    return pid


def _join(mt: _Meeting) -> None:
    """Another process: connect to process 0 (retrying until the deadline), say hello, wait
    for its go."""
    import socket
    import time
    while True:
        try:
            sock = socket.create_connection((mt.host, mt.port),
                                            timeout=max(0.1, min(2.0, mt.left())))
        except OSError:
            if not mt.left():
                mt.fail(f"process 0 was not reachable at {mt.coordinator}")
            time.sleep(min(0.2, mt.left()))
            continue
        try:
            sock.sendall(_HELLO + f" {mt.me} {mt.n}\n".encode())
            sock.settimeout(max(0.1, mt.left()))
            answer = sock.recv(16)
        except OSError:
            answer = b""
        finally:
            sock.close()
        if answer.startswith(b"go"):
            return
        if not mt.left():
            mt.fail("not every process connected to process 0")
        time.sleep(0.2)                             # process 0 restarted or refused: try again
