"""The command line: parse, call one core function, print. Nothing else lives here.

One error boundary (`main`) turns every way a command ends into an exit code of the contract (listed
in `ablate.errors`): an AblateError becomes its exit code (1 or 2) and a one-line message on stderr,
and `{"error": ...}` on stdout under --json unless the command's one JSON object is already there;
click usage errors are one line, exit 2; Ctrl-C is exit 130; a SystemExit a command raises itself
(`status --watch` leaving on Ctrl-C) keeps its code; any other exception is unexpected: exit 3, one
line naming it and the log file that holds its traceback (`$XDG_STATE_HOME/ablate/`, else
`~/.local/state/ablate/`, else the temp dir).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from ablate import __version__
from ablate.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, AblateError, CheckFailed
from ablate.util import timings


class App:
    """Built once by the root group and handed to every command through ctx.obj."""

    json_emitted = False  # a command's JSON result is on stdout: an error must not add a second object

    def __init__(self, directory: str, verbosity: int) -> None:
        from ablate.util.progress import StderrLog

        self.directory = Path(directory)
        self.verbosity = verbosity
        # Progress for humans: stderr, so stdout stays data; `.bar`: a progress bar may be drawn.
        self.log = StderrLog(verbosity)

    def project(self) -> Any:
        from ablate.config.project import load_project

        project = load_project(self.directory)
        timings.mark("project")
        return project

    def emit(self, result: Any, as_json: bool) -> None:
        if as_json:
            click.echo(json.dumps(result.to_json(), sort_keys=False))
            App.json_emitted = True
        else:
            for line in result.lines():
                click.echo(line)
        timings.mark("output")


pass_app = click.make_pass_decorator(App)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


def _hosts(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [h.strip() for h in value.split(",")]
    if not all(names):
        raise AblateError(f"--hosts {value!r}: expected comma-separated host names like a,b")
    return names


def _accept_new(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        from ablate.transport import accept_new_host_keys as set_accept_new

        set_accept_new(True)


_ACCEPT_HELP = "Record an unknown SSH host key (as OpenSSH accept-new); a changed key is refused."


class _Group(click.Group):
    """Every subcommand also takes --accept-new-host-keys (`ablate doctor --accept-new-host-keys`
    as well as `ablate --accept-new-host-keys doctor`)."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.append(click.Option(["--accept-new-host-keys"], is_flag=True, expose_value=False,
                                       is_eager=True, callback=_accept_new, help=_ACCEPT_HELP))
        super().add_command(cmd, name)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ablate")
@click.option("-C", "directory", default=".", metavar="DIR", help="Run as if started in DIR.")
@click.option("-v", "--verbose", count=True, help="More output.")
@click.option("-q", "--quiet", count=True, help="Less output.")
@click.option("--accept-new-host-keys", is_flag=True, help=_ACCEPT_HELP)
@click.option("--lock-timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help="How long to wait for another controller acting on the sweep "
              "(env ABLATE_LOCK_TIMEOUT; default 120).")
@click.pass_context
def cli(ctx: click.Context, directory: str, verbose: int, quiet: int, accept_new_host_keys: bool,
        lock_timeout: float | None) -> None:
    """Run ML ablation sweeps across rented GPU instances that share a filesystem.

    \b
    Typical flow:
      ablate plan && ablate deploy && ablate launch --all
      ablate status --watch
      ablate logs CELL -f
      ablate pull && ablate reconcile && ablate release HOST

    \b
    Shell completion (bash; zsh/fish: zsh_source, fish_source):
      eval "$(_ABLATE_COMPLETE=bash_source ablate)"
    NO_COLOR=1 turns colours off; -q silences progress, errors always go to stderr.

    \b
    Exit codes: 0 done; 1 the check failed (or a host or the shared FS did);
    2 bad input or config; 3 an unexpected internal error (one line naming it and
    the log with its traceback, under ~/.local/state/ablate/); 130 interrupted.
    """
    from ablate.sweep.lock import set_lock_timeout
    from ablate.transport import accept_new_host_keys as set_accept_new

    set_accept_new(accept_new_host_keys)
    set_lock_timeout(lock_timeout)
    ctx.obj = App(directory, verbose - quiet)


@cli.command()
@click.option("--profile", default="local", show_default=True, help="Profile the template starts from.")
@pass_app
def init(app: App, profile: str) -> None:
    """Scaffold ablate.yaml and queues/ here.  Example: ablate init --profile autodl"""
    from ablate.config.scaffold import init as do_init

    for path in do_init(app.directory, profile):
        click.echo(f"created {path}")


@cli.command()
@click.option("--host", "hosts", help="Check only these hosts (comma-separated; default: all).")
@json_option
@pass_app
def doctor(app: App, hosts: str | None, as_json: bool) -> None:
    """Preflight per host: SSH, tmux, shared FS really shared, budget, GPUs, drift.  Example: ablate doctor"""
    from ablate.doctor.command import doctor as do_doctor

    report = do_doctor(app.project(), _hosts(hosts), log=app.log)
    app.emit(report, as_json)
    if not report.ok:
        raise CheckFailed(f"doctor found {report.problems} problem(s); see the lines above")


@cli.command()
@click.option("--hosts", help="Comma-separated hosts to plan on (default: all).")
@click.option("--dry-run", is_flag=True, help="Print the plan without writing queue files.")
@json_option
@pass_app
def plan(app: App, hosts: str | None, dry_run: bool, as_json: bool) -> None:
    """Balance the cells by cost into one queue file per host/slot.  Example: ablate plan --hosts a,b"""
    from ablate.plan.planner import plan as do_plan

    app.emit(do_plan(app.project(), _hosts(hosts), write=not dry_run, log=app.log), as_json)


@cli.command()
@click.option("--gc", is_flag=True, help="Only remove old wrapper versions and specs no live queue reads.")
@json_option
@pass_app
def deploy(app: App, gc: bool, as_json: bool) -> None:
    """Place the wrappers and run specs on the shared FS, content-addressed.  Example: ablate deploy"""
    from ablate.run import deploy as core

    if gc:
        app.emit(core.gc(app.project(), log=app.log), as_json)
        return
    app.emit(core.deploy(app.project(), log=app.log), as_json)


@cli.command()
@click.argument("queue", required=False)
@click.option("--host", help="The host that runs the queue.")
@click.option("--start-index", type=click.IntRange(min=0), help="Line index (from 0) to start at.")
@click.option("--slot", type=click.IntRange(min=0), help="GPU slot of a multi-GPU host.")
@click.option("--all", "all_", is_flag=True, help="Start every planned queue on its host.")
@json_option
@pass_app
def launch(app: App, queue: str | None, host: str | None, start_index: int | None,
           slot: int | None, all_: bool, as_json: bool) -> None:
    """Start one detached tmux queue.  Example: ablate launch h1 --host h1"""
    if not all_:
        if not queue or not host:
            raise AblateError("launch needs QUEUE and --host H (or --all); e.g. `ablate launch h1 --host h1`")
        from ablate.run import launch as core

        return app.emit(core.launch(app.project(), queue, host, start_index=start_index, slot=slot,
                                    log=app.log), as_json)
    if queue or host or start_index is not None or slot is not None:
        raise AblateError("launch --all takes no QUEUE, --host, --start-index or --slot")
    from ablate.run.local_queues import connect_planned

    project = app.project()
    local = connect_planned(project)  # the hosts connect while the pipeline's modules load
    from ablate.run import launch as core
    results = core.launch_all(project, log=app.log, local=local)
    app.emit(_Many(results, "launched"), as_json)
    if failed := [r.queue for r in results if r.status == "failed"]:
        raise CheckFailed(f"{len(failed)} queue(s) did not start: {', '.join(failed)}; see the lines above")


@cli.command()
@click.argument("queue")
@click.argument("cfg")
@click.argument("task")
@click.argument("epochs", required=False, type=click.IntRange(min=1))
@json_option
@pass_app
def append(app: App, queue: str, cfg: str, task: str, epochs: int | None, as_json: bool) -> None:
    """Append a cell to a queue; restarts it if drained.  Example: ablate append h1 cfgs/x.yaml recon 20"""
    from ablate.run.append import append as do_append

    app.emit(do_append(app.project(), queue, cfg, task, epochs), as_json)


@cli.command()
@click.option("--watch", is_flag=True, help="Live dashboard; q or Ctrl-C to leave.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Refresh interval for --watch, seconds.")
@json_option
@pass_app
def status(app: App, watch: bool, interval: float, as_json: bool) -> None:
    """Per queue: k/n, current cell, elapsed, heartbeat age, done vs synced.  Example: ablate status"""
    from ablate.monitor import ahead

    project = app.project()
    started = ahead.start(project, trips=not watch)  # `ssh -G`, the round trips: out while `core` loads
    from ablate.monitor import status as core

    if watch:
        if as_json:
            raise AblateError("--watch and --json do not go together; use `ablate status --json` in a loop")
        core.watch(project, interval)
        return
    app.emit(core.status(project, live_info=True, sent=started), as_json)


def _complete_cells(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of CELL: the roster's names (nothing when the project does not load)."""
    try:
        from ablate.config.project import load_project
        from ablate.sweep.cells import load_roster

        directory = ctx.find_root().params.get("directory") or "."
        return [n for n in load_roster(load_project(directory)).names if n.startswith(incomplete)]
    except Exception:  # completion must never print a traceback into the user's shell
        return []


@cli.command()
@click.argument("cell", shell_complete=_complete_cells)
@click.option("-f", "--follow", is_flag=True, help="Keep printing while the cell runs (until it ends).")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=50, show_default=True,
              help="How many of the last lines to print.")
@pass_app
def logs(app: App, cell: str, follow: bool, lines: int) -> None:
    """A cell's log, live from the host that runs it or its durable copy.  Example: ablate logs c3 -f"""
    from ablate.monitor.logs import logs as do_logs

    out = sys.stdout.buffer  # click.get_binary_stream is deprecated (click 8.5)

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    do_logs(app.project(), cell, lines=lines, follow_=follow, out=write, log=app.log)


@cli.command()
@click.argument("queue")
@click.option("--host", required=True, help="The host that runs the queue.")
@click.option("--after-current", is_flag=True, help="Let the current cell finish, then start nothing more.")
@json_option
@pass_app
def stop(app: App, queue: str, host: str, after_current: bool, as_json: bool) -> None:
    """Stop a queue and its process group.  Example: ablate stop h1 --host h1"""
    from ablate.run.stop import stop as do_stop

    app.emit(do_stop(app.project(), queue, host, after_current=after_current), as_json)


@cli.command()
@click.option("--cancel", is_flag=True, help="Never let these instances stop themselves.")
@click.option("--idle", metavar="D", help="Stop after D idle (20s, 10m; 0: at once); alone, undoes --cancel.")
@click.option("--host", "hosts", multiple=True, metavar="H", help="Repeat, or a,b (default: autostop on).")
@json_option
@pass_app
def autostop(app: App, cancel: bool, idle: str | None, hosts: tuple[str, ...], as_json: bool) -> None:
    """Show, cancel or re-time each instance's autostop.  Example: ablate autostop --idle 20m --host h1

    Alone: what each host waits for. Unknown host, bad D, no host on: exit 2, nothing written."""
    from ablate.run.autostop_control import autostop as do_autostop
    app.emit(do_autostop(app.project(), hosts or None, cancel=cancel, idle=idle), as_json)


@cli.command()
@click.option("--to", "to", type=click.Path(file_okay=False),
              help="Local directory (default ./results/<sweep>).")
@json_option
@pass_app
def pull(app: App, to: str | None, as_json: bool) -> None:
    """Copy final_ckpts/ here, resumable and checksummed.  Example: ablate pull --to /data/results"""
    from ablate.results.pull import pull as do_pull

    result = do_pull(app.project(), Path(to) if to else None, log=app.log,
                     bar=app.verbosity >= 0 and sys.stderr.isatty())
    app.emit(result, as_json)
    if not result.ok:
        raise CheckFailed(f"{len(result.failed)} file(s) could not be pulled intact; run `ablate pull` again")


@cli.command()
@click.option("--fs", is_flag=True, help="Verify the durable copies on the shared FS instead of pulled ones.")
@click.option("--host", help="With --fs over SSH: the live host that reads the FS.")
@click.option("--no-load", is_flag=True, help="Check existence, sizes and hashes only; do not load.")
@json_option
@pass_app
def reconcile(app: App, fs: bool, host: str | None, no_load: bool, as_json: bool) -> None:
    """Roster vs results, every artifact loaded; exit 0 only at 100 %.  Example: ablate reconcile"""
    from ablate.results.reconcile import reconcile as do_reconcile

    if host and not fs:
        raise AblateError("--host goes with --fs (the host that reads the shared FS)")
    report = do_reconcile(app.project(), fs=fs, host=host, load=not no_load, log=app.log)
    app.emit(report, as_json)
    if not report.complete:
        sys.exit(1)


@cli.command()
@click.option("--hosts", help="Comma-separated live hosts to re-run on (default: every live host).")
@click.option("--launch", "launch_", is_flag=True, help="Start the new queues right away.")
@json_option
@pass_app
def remediate(app: App, hosts: str | None, launch_: bool, as_json: bool) -> None:
    """Re-run every failed, lost or never-run cell with its identical queue line on live hosts.

    Example: ablate remediate --launch"""
    from ablate.results.remediate import remediate as do_remediate

    result = do_remediate(app.project(), _hosts(hosts), launch=launch_, log=app.log)
    app.emit(result, as_json)
    if result.failed_launches:
        raise CheckFailed(f"{len(result.failed_launches)} queue(s) did not start: "
                          f"{', '.join(result.failed_launches)}; see the lines above")


@cli.command()
@click.argument("host")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@pass_app
def release(app: App, host: str, yes: bool, as_json: bool) -> None:
    """The teardown gate: release HOST only when every result is reconciled.  Example: ablate release h1"""
    from ablate.results.release import release as do_release

    def confirm(question: str) -> bool:
        if not sys.stdin.isatty():
            raise AblateError("release needs confirmation: run it in a terminal or pass --yes")
        return click.confirm(question, default=False, err=True)

    app.emit(do_release(app.project(), host, yes=yes, confirm=confirm, log=app.log), as_json)


@cli.command()
@click.option("--out", type=click.Path(file_okay=False), metavar="DIR",
              help="Where to write report.html, timeline.png, ablation.csv/.md/.tex and "
                   "ablation_groups.csv (default ./reports/<sweep>).")
@json_option
@pass_app
def report(app: App, out: str | None, as_json: bool) -> None:
    """HTML report: timeline, roster, ablation table; PNG and CSV beside it.  Example: ablate report"""
    from ablate.report import report as do_report

    app.emit(do_report(app.project(), Path(out) if out else None, log=app.log), as_json)


@cli.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="Where to build the demo project (default: a new temp dir).")
@click.option("--cells", type=click.IntRange(min=3, max=200), default=12, show_default=True)
@pass_app
def demo(app: App, directory: str | None, cells: int) -> None:
    """The whole flow on this machine with a tiny real trainer.  Example: ablate demo"""
    from ablate.demo.run import run_demo

    run_demo(Path(directory) if directory else None, n_cells=cells, echo=click.echo)


class _Many:
    """Several results of one kind printed as one object."""

    def __init__(self, results: list[Any], key: str) -> None:
        self.results, self.key = results, key

    def to_json(self) -> dict[str, Any]:
        return {self.key: [r.to_json() for r in self.results]}

    def lines(self) -> list[str]:
        return [line for r in self.results for line in r.lines()]


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main(argv: list[str] | None = None, prog: click.Group = cli) -> None:
    """The one error boundary: every way a command ends becomes an exit code of `ablate.errors`."""
    timings.mark("main")
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    App.json_emitted = False
    try:
        rv = prog.main(args=args, prog_name="ablate", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:  # usage errors: one line, exit 2
        ctx = getattr(e, "ctx", None)
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        _fail(f"{_one_line(e.format_message())}{where}", EXIT_BAD_INPUT, as_json)
    except click.Abort:
        _fail("aborted", EXIT_INTERRUPTED, as_json)
    except AblateError as e:
        _fail(_one_line(e.message), e.exit_code, as_json)
    except KeyboardInterrupt:
        _fail("interrupted", EXIT_INTERRUPTED, as_json)
    except SystemExit:
        raise  # a command that exits on its own keeps its code (`status --watch`: 130 on Ctrl-C)
    except BaseException as e:  # anything else is a bug or a failure nothing anticipated: ours to fix
        log = _crash_log(e, args)
        where = f"traceback in {log}" if log else "no log file could be written; traceback below"
        import traceback

        _fail(f"unexpected {_describe(e)} ({where})", EXIT_INTERNAL, as_json,
              detail=None if log else "".join(traceback.format_exception(e)))
    finally:
        transport = sys.modules.get("ablate.transport")  # a command that used none never imports it
        if transport is not None:
            with contextlib.suppress(Exception):  # closing connections never changes how a command ended
                transport.close_all()
        if argv is None:
            # The process ends here: its objects need no collection at the interpreter's exit, which
            # costs a warm `status` ~35 ms (in-process callers, the tests, keep collecting).
            gc.freeze()
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)


def _fail(message: str, code: int, as_json: bool, detail: str | None = None) -> NoReturn:
    # A closed or broken stream must not turn the report into a traceback: the exit code still tells.
    with contextlib.suppress(OSError, ValueError):
        click.echo(f"ablate: error: {message}", err=True)
        if detail:
            click.echo(detail.rstrip("\n"), err=True)
    if as_json and not App.json_emitted:
        with contextlib.suppress(OSError, ValueError):
            click.echo(json.dumps({"error": message}))
    sys.exit(code)


def _describe(e: BaseException) -> str:
    """`PermissionError: [Errno 13] Permission denied: '/x'`: the type and message on one line."""
    kind = type(e)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    try:
        text = _one_line(str(e))
    except Exception:  # a broken __str__ must not break the report
        text = ""
    if len(text) > 500:
        text = text[:500] + "..."
    return f"{name}: {text}" if text else name


def _log_dir() -> Path:
    """Where tracebacks of unexpected errors go: $XDG_STATE_HOME/ablate (when absolute, as the XDG
    spec asks), else ~/.local/state/ablate."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "ablate"


def _crash_log(e: BaseException, argv: list[str]) -> str | None:
    """Write `e`'s traceback to a new file named by the time and pid in `_log_dir()` or, when that
    cannot be written, the temp dir. Its path, or None when neither worked. Never raises."""
    try:
        import platform  # these only here: a few ms off every start
        import shlex
        import tempfile
        import time
        import traceback

        now = time.gmtime()
        try:
            cwd = os.getcwd()
        except OSError as why:
            cwd = f"? ({why})"
        text = (f"ablate {__version__} on Python {platform.python_version()} ({platform.platform()})\n"
                f"time: {time.strftime('%Y-%m-%dT%H:%M:%SZ', now)}  pid: {os.getpid()}\n"
                f"cwd: {cwd}\nargv: {shlex.join(['ablate', *argv])}\n\n"
                + "".join(traceback.format_exception(e)))
        prefix = f"ablate-error-{time.strftime('%Y%m%dT%H%M%SZ', now)}-{os.getpid()}-"
    except Exception:
        return None
    import tempfile

    for where in (_log_dir, lambda: Path(tempfile.gettempdir())):
        path = None
        try:
            directory = where()
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            # mkstemp: a new file (O_EXCL, 0600) even in a shared temp dir or twice in one second
            fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write(text)
            return path
        except Exception:  # not writable (or full): the next place, else no log at all
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return None
