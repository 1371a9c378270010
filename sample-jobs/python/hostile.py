"""`hostile` in Python: one handler that tries, by its param, each thing a sandboxed script must
not be able to do, so that one build covers every containment case.

Contract: param = `<probe>` or `<probe>:<argument>`. Each probe logs `probing <probe>` first.
- `loop`: computes forever; ends only when the host stops it (fuel or deadline).
- `bomb`: allocates 1 MiB blocks forever; ends when memory growth is refused.
- `sleep:<ms>`: sleeps that long, then returns `slept <ms> ms`.
- `listdir:<path>`: `os.listdir(path)`; `open:<path>`: reads the file;
  `tcp:<port>`: connects to 127.0.0.1:<port>; `udp:<port>`: sends a datagram to it;
  `dns:<name>`: resolves the name. Each returns what it got, which is data the sandbox should
  never give: when the operation fails (as it must), the run fails with
  `denied: <probe>: <exception type>: <message>`.
"""

import os
import time

import wit_world
from componentize_py_types import Err
from wit_world.imports.log import Level, log
from wit_world.imports.types import Trigger


def _listdir(path: str) -> str:
    return ",".join(os.listdir(path or "/"))


def _open(path: str) -> str:
    with open(path or "/etc/passwd") as file:
        return file.read()


def _tcp(port: str) -> str:
    import socket

    with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as sock:
        return f"connected from {sock.getsockname()}"


def _udp(port: str) -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sent = sock.sendto(b"hello", ("127.0.0.1", int(port)))
        return f"sent {sent} bytes"


def _dns(name: str) -> str:
    import socket

    return repr(socket.getaddrinfo(name or "localhost", 80))


PROBES = {"listdir": _listdir, "open": _open, "tcp": _tcp, "udp": _udp, "dns": _dns}


class WitWorld(wit_world.WitWorld):
    def run(self, t: Trigger) -> str:
        probe, _, argument = t.param.partition(":")
        log(Level.INFO, f"probing {probe}")
        if probe == "loop":
            n = 0
            while True:
                n += 1
        if probe == "bomb":
            blocks = []
            while True:
                blocks.append(bytearray(1024 * 1024))
        if probe == "sleep":
            time.sleep(int(argument) / 1000)
            return f"slept {argument} ms"
        action = PROBES.get(probe)
        if action is None:
            raise Err(f"unknown probe `{probe}`")
        try:
            return action(argument)
        except BaseException as error:
            raise Err(f"denied: {probe}: {type(error).__name__}: {error}")
