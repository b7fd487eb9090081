"""The probes asked before a Spark session is tried, against small servers of each kind (the
real master, web UI and Connect server: tests/test_cluster.py and tests/test_connect.py)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from spark_backend.spark.probes import connect_port_problem, master_port_problem


@contextmanager
def _server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on the loopback that runs ``answer`` on each connection; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def _silent_until_eof(conn: socket.socket) -> None:
    """As a Spark master does with an unfinished frame: reads, says nothing, closes at EOF."""
    while conn.recv(1024):
        pass


def _banner(conn: socket.socket) -> None:
    """As an SSH server does: its banner first, then it reads the client's words (closing at
    once, with the probe's bytes unread, would reset the connection and could drop the banner
    before the probe reads it: a race no real server makes)."""
    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
    while conn.recv(1024):
        pass


def _h2_settings(conn: socket.socket) -> None:
    conn.recv(1024)
    conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # an empty SETTINGS frame


@contextmanager
def _web() -> Iterator[int]:
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        yield web.server_address[1]
    finally:
        web.shutdown()
        web.server_close()


def test_a_port_that_takes_an_unfinished_frame_without_a_word_passes_as_a_master():
    with _server(_silent_until_eof) as port:
        assert master_port_problem("127.0.0.1", port) is None


def test_a_web_server_or_a_banner_is_not_a_master():
    with _web() as port:
        said = master_port_problem("127.0.0.1", port)
    assert said.startswith(f"a web server answers at 127.0.0.1:{port}, not a Spark master (a "
                           "standalone master's web UI answers so"), said
    with _server(_banner) as port:
        assert master_port_problem("127.0.0.1", port) == (
            f"an SSH server answers at 127.0.0.1:{port}, not a Spark master")


def test_a_connect_port_must_greet_as_grpc_does():
    with _server(_h2_settings) as port:
        assert connect_port_problem("127.0.0.1", port, tls=False) is None
    with _web() as port:
        said = connect_port_problem("127.0.0.1", port, tls=False)
        assert said.endswith(f"answers at 127.0.0.1:{port}, not a Spark Connect (gRPC) server")
    with _server(lambda conn: None) as port:  # closes at once
        assert connect_port_problem("127.0.0.1", port, tls=False) == (
            f"the server at 127.0.0.1:{port} closed the connection at a gRPC client's greeting")
    with _server(_h2_settings) as port:  # a plaintext server asked through TLS
        said = connect_port_problem("127.0.0.1", port, tls=True)
        assert said.startswith(f"the server at 127.0.0.1:{port} does not speak TLS ("), said
        assert said.endswith("put the server behind TLS or leave those out"), said
