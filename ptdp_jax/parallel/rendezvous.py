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
    import select
    import socket
    import time

    host, port = setup.coordinator.rsplit(":", 1)
    host, port = host.strip("[]"), int(port)
    me, n = setup.process_id, setup.num_processes
    deadline = time.monotonic() + timeout
    left = lambda: max(0.0, deadline - time.monotonic())
    where = f"coordinator {setup.coordinator}, process {me} of {n}, from {setup.source}"

    def fail(what: str):
        raise DistributedError(f"jax.distributed could not start ({where}): {what} within "
                               f"{timeout:g} s (--init-timeout / PTDP_INIT_TIMEOUT); start all "
                               f"{n} processes with the same --coordinator and --num-processes")

    if me == 0:
        srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind(("", port))
        except OSError as e:
            srv.close()
            raise DistributedError(f"jax.distributed could not start ({where}): cannot listen "
                                   f"on port {port}: {e}") from None
        srv.listen(n)
        peers: dict[int, socket.socket] = {}
        pending: list[socket.socket] = []
        try:
            while len(peers) < n - 1:
                ready, _, _ = select.select([srv] + pending, [], [], min(0.5, left()))
                if not ready and not left():
                    missing = sorted(set(range(1, n)) - set(peers))
                    fail(f"process{'es' if len(missing) > 1 else ''} "
                         f"{', '.join(map(str, missing))} did not connect")
                for sock in ready:
                    if sock is srv:
                        conn, _ = srv.accept()
                        pending.append(conn)
                        continue
                    pending.remove(sock)
                    try:
                        msg = sock.recv(256).decode(errors="replace").split()
                    except OSError:
                        msg = []
                    if len(msg) != 3 or msg[0] != _HELLO.decode():
                        sock.close()               # not one of ours (a port scan): ignore it
                        continue
                    pid, count = int(msg[1]), int(msg[2])
                    if count != n:
                        sock.close()
                        raise DistributedError(f"jax.distributed could not start ({where}): "
                                               f"process {pid} says --num-processes {count}")
                    if pid in peers or not 0 < pid < n:
                        sock.close()
                        raise DistributedError(f"jax.distributed could not start ({where}): "
                                               f"two processes say --process-id {pid}")
                    peers[pid] = sock
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
        return

    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(2.0, left())))
        except OSError:
            if not left():
                fail(f"process 0 was not reachable at {setup.coordinator}")
            time.sleep(min(0.2, left()))
            continue
        try:
            sock.sendall(_HELLO + f" {me} {n}\n".encode())
            sock.settimeout(max(0.1, left()))
            answer = sock.recv(16)
        except OSError:
            answer = b""
        finally:
            sock.close()
        if answer.startswith(b"go"):
            return
        if not left():
            fail("not every process connected to process 0")
        time.sleep(0.2)                             # process 0 restarted or refused: try again
