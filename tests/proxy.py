"""A loopback TCP proxy for the dead-connection tests: it forwards to a database server and can
freeze the connections it carries (keep them open, forward nothing, send no RST), as a hung pooler
or a NAT that forgot them does, while new connections still work, or hang as well (a partition).

``cut_after`` cuts one connection deterministically between two round trips of a transaction: it
watches the bytes the client sends (the queue's SQL goes as plain text on loopback) and the
server's answers, and holds the client's next request on that connection."""

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
        self.cut = threading.Event()  # set when cut_after's connection was cut
        self._cut_on: tuple[tuple[bytes, ...], bytes] | None = None
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

    def cut_after(self, request: bytes | tuple[bytes, ...], reply: bytes = b"") -> threading.Event:
        """Cut the first connection whose client sends a request containing ``request`` (each of
        them, for several) and then
        gets an answer containing ``reply`` (anything if empty): its next request is never
        forwarded, and every connection is frozen from then on (a partition: ``heal`` ends it for
        new ones). So the server holds that connection's transaction open after its first round
        trip, as after a worker that lost the network. Returns ``self.cut``, set once cut."""
        with self.lock:
            self._cut_on = (request if isinstance(request, tuple) else (request,), reply)
        return self.cut

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
        asked = answered = False  # cut_after's request went through, and its reply came back
        try:
            while not frozen.is_set() and not self.closed.is_set():
                ready, _, _ = select.select(list(ends), [], [], 0.1)
                if frozen.is_set():
                    break
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return self._shut(client, upstream)
                    cut_on = self._cut_on
                    if cut_on is not None and s is client:
                        if asked and answered and self._cut_here():
                            break  # the next request: held
                        asked, answered = all(part in data for part in cut_on[0]), False
                    elif cut_on is not None and asked and cut_on[1] in data:
                        answered = True
                    ends[s].sendall(data)
                else:
                    continue
                break
            # Frozen: the kernel still acknowledges what arrives; nothing is read or sent.
            self.closed.wait()
        except OSError:
            self._shut(client, upstream)

    def _cut_here(self) -> bool:
        """Take the one cut (False if another connection took it) and partition."""
        with self.lock:
            if self._cut_on is None:
                return False
            self._cut_on = None
        self.partition()
        self.cut.set()
        return True

    def _shut(self, *socks: socket.socket) -> None:
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
