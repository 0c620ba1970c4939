"""The host agent's code: versioned by its content (the socket's name), and compiled once per host
and interpreter by the bootstrap, a kept copy that is damaged or of another interpreter
compiled again and replaced, nothing kept without HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ablate.transport.agentlink import agent_code, bootstrap, remote_socket


def test_the_agent_code_is_versioned_by_content() -> None:
    code = agent_code()
    assert remote_socket("root") == f"/tmp/ablate-agent-root/{code.version}.sock"
    assert remote_socket("bad user") is None and remote_socket("../x") is None


def test_the_agent_is_compiled_once_per_host_and_interpreter_and_a_bad_copy_is_compiled_again(
        tmp_path: Path) -> None:
    """The bootstrap keeps the agent's code object in the user's cache dir (a third of its start):
    a kept one is what runs; one that is damaged (cut short, another checksum) or of another
    interpreter is compiled again and replaced; without HOME, nothing is kept and the agent still
    starts."""
    import marshal
    import zlib

    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("XDG_CACHE_HOME", None)
    kept = (tmp_path / ".cache" / "ablate" / "agent" /
            f"{agent_code().version}-{sys.implementation.cache_tag}.bin")
    tag = sys.version.encode() + b"\0"

    def boot(n: int, environ: dict[str, str]) -> bytes:
        sock = str(tmp_path / f"a{n}" / "a.sock")
        r = subprocess.run(["sh", "-c", bootstrap(sys.executable, sock, 30) + "true"], env=environ,
                           capture_output=True, timeout=30)
        subprocess.run(["pkill", "-f", sock], check=False)
        return r.stderr

    assert boot(1, env) == b"ablate-agent: up\n"
    assert kept.read_bytes().startswith(tag)
    marker = marshal.dumps(compile("def main(argv):\n    print('ablate-agent: from the kept copy')\n"
                                   "    return 0\n", "kept", "exec"))

    def copy(tag: bytes, code: bytes) -> bytes:
        return tag + b"%08x" % zlib.crc32(code) + code

    kept.write_bytes(copy(tag, marker))
    assert boot(2, env) == b"ablate-agent: from the kept copy\n"
    for bad in (b"damaged", copy(b"Python 0.1\0", marker), copy(tag, marker)[:-3], copy(tag, b"\xff"),
                tag + b"%08x" % (zlib.crc32(marker) ^ 1) + marker):
        kept.write_bytes(bad)
        assert boot(3, env) == b"ablate-agent: up\n"
        assert kept.read_bytes().startswith(tag) and kept.read_bytes() != bad
    homeless = {k: v for k, v in env.items() if k != "HOME"}
    kept.unlink()
    assert boot(4, homeless) == b"ablate-agent: up\n" and not kept.exists()
