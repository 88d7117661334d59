"""A loopback TCP proxy for the dead-connection tests: it forwards to a database server and can
freeze the connections it carries (keep them open, forward nothing, send no RST), as a hung pooler
or a NAT that forgot them does, while new connections still work, or hang as well (a partition)."""

from __future__ import annotations

import select
import socket
import threading


class Proxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self.partitioned = threading.Event()  # new connections are frozen too
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def client_ports(self) -> list[int]:
        """The source ports of the connections carried now (the worker's side)."""
        with self.lock:
            return [c.getpeername()[1] for c, _, _ in self.pairs if c.fileno() >= 0]

    def freeze(self) -> int:
        """Stop forwarding on every connection carried now; return how many."""
        with self.lock:
            for _, _, frozen in self.pairs:
                frozen.set()
            return len(self.pairs)

    def partition(self) -> None:
        """Freeze what is carried and every connection made from now on."""
        self.partitioned.set()
        self.freeze()

    def heal(self) -> None:
        """New connections forward again; the frozen ones stay frozen (they are dead)."""
        self.partitioned.clear()

    def close(self) -> None:
        self.closed.set()
        self.server.close()
        with self.lock:
            for c, u, frozen in self.pairs:
                frozen.set()
                for s in (c, u):
                    try:
                        s.close()
                    except OSError:
                        pass

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            frozen = threading.Event()
            if self.partitioned.is_set():
                frozen.set()
                with self.lock:
                    self.pairs.append((client, client, frozen))
                continue  # accepted, never answered
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pairs.append((client, upstream, frozen))
            threading.Thread(target=self._pump, args=(client, upstream, frozen), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket, frozen: threading.Event) -> None:
        ends = {client: upstream, upstream: client}
        try:
            while not frozen.is_set() and not self.closed.is_set():
                ready, _, _ = select.select(list(ends), [], [], 0.1)
                if frozen.is_set():
                    break
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return self._shut(client, upstream)
                    ends[s].sendall(data)
            # Frozen: the kernel still acknowledges what arrives; nothing is read or sent.
            self.closed.wait()
        except OSError:
            self._shut(client, upstream)

    def _shut(self, *socks: socket.socket) -> None:
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
