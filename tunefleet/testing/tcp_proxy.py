"""A loopback TCP proxy a test controls, to cut a real server off and bring it back.

``pause()`` closes every open connection and stops listening (new connections are refused), as
when a database host drops off the network; ``resume()`` listens again on the same port.
``drop_connections()`` resets the open connections only, as a blip on the network does.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from types import TracebackType

from tunefleet.testing.ports import free_port

log = logging.getLogger(__name__)


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port`` until paused."""

    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self.connections_cut = 0
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None

    # -- control ------------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                                           name=f"tcp-proxy-{self.port}")
        self._accepting.start()
        return self

    def pause(self) -> None:
        """Refuse new connections and reset the open ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._accepting is not None:
            self._accepting.join(timeout=5)
        self.drop_connections()
        log.info("proxy %d paused", self.port)

    def drop_connections(self) -> int:
        """Reset every open connection but keep listening (a network blip: the next connection
        gets through); returns how many were cut. Safe to call from a hook on the client's thread."""
        with self._lock:
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            self._close(pair)
        self.connections_cut += len(pairs)
        log.info("proxy %d: %d connection(s) cut", self.port, len(pairs))
        return len(pairs)

    def resume(self) -> None:
        if self._listener is not None:  # not paused
            return
        self.start()
        log.info("proxy %d resumed", self.port)

    def stop(self) -> None:
        self.pause()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    # -- forwarding ---------------------------------------------------------------------------
    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by pause()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

    def _pump(self, pair: tuple[socket.socket, socket.socket]) -> None:
        client, upstream = pair
        sel = selectors.DefaultSelector()
        try:
            sel.register(client, selectors.EVENT_READ, upstream)
            sel.register(upstream, selectors.EVENT_READ, client)
            while True:
                for key, _ in sel.select(timeout=1.0):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
                with self._lock:
                    if pair not in self._pairs:
                        return
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            with self._lock:
                self._pairs.discard(pair)
            self._close(pair)

    @staticmethod
    def _close(pair: tuple[socket.socket, socket.socket]) -> None:
        for sock in pair:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
