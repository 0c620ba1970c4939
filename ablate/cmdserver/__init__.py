"""The command server: `ablate`'s commands started from a process whose modules are already loaded.

Every command is a new Python process, and most of a quick one (a warm `ablate status`, a
`status --json` in a loop) is its imports: click, the config's model, the transports, the
command's own modules (~0.15 s of a 0.25 s status at 8 hosts; docs/BENCHMARKS.md). As Mercurial's
`chg` does, the first command on a machine starts a server (`server.py`) that imports them once and
waits; every later command is a small client (`client.py`: the standard library only) that hands the
server its arguments, working directory, environment, umask and its own stdin, stdout and stderr (the
descriptors themselves, over a Unix socket), and waits. The server forks a child that becomes that
command (those descriptors, that directory, that environment, a process group of its own) and
runs `ablate.cli.main`; the client forwards the signals it gets (Ctrl-C, a hang-up, a terminal's
resize, a suspend) to the child's group and exits as the child did. Nothing else changes: the same
code runs the same way, with the same output and exit codes.

- Only the same code: a server serves the interpreter, its flags, its `sys.path` and the exact
  files of `ablate` it was started with (a fingerprint of their names, sizes and mtimes names its
  socket); an upgrade or an edit is a new server, and the old one exits when idle (10 min).
- Only its user: the socket's directory is the user's own and private (else no server), and the
  server refuses a peer of another uid.
- Never twice: the client sends the command only after the server's hello came back; until then
  any failure runs the command here, as without a server. Once sent, a lost server is the command's
  failure (exit 3), never a second run.
- Where it is used: Linux, by default; `ABLATE_CMDSERVER=0` turns it off, `=1` forces it on
  elsewhere (macOS: a forked child of a process that may have touched system frameworks can crash,
  so it stays off there unless asked).
"""
