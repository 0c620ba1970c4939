"""run_one's sync, the file work (docs/ARCHITECTURE.md, "run_one"): the checkpoint entries resolved
as ablate.yaml names them, each file copied into the staging dir on the shared FS and checked (size
and sha256 of the copy against its source), and MANIFEST.json written beside them. Stdlib only;
part of the runner's zipapp, asked of the queue's served runner (`runner.py serve`) by run_one, or
run as a Python start of its own where run_one has none (run by hand, or that process is gone):

    python3 -S runner.<sha12>.pyz publish --staging DIR --ckpt-dir DIR --log FILE
        --checkpoint "ENTRY ..." [--pick all|newest] [--metrics FILE] --workdir DIR --host HOST
        --queue QUEUE --started T --ended T [--wrapper FILE] [--run-queue FILE] [--spec FILE]
        NAME CFG TASK EPOCHS CAT RESUME

(the run spec's values and run_one's own arguments). Exit 0: every file copied and checked,
MANIFEST.json written; 1: the sync failed, its reason one line on stdout (run_one's `fail` waits
for the FS and syncs again, or records `sync_failed` with it); 2: bad arguments. run_one keeps what
decides on the shared FS: the staging dir, "already exists", the Slurm attempt's fence, the
publishing rename and its check that the published MANIFEST.json is this run's (`ours`, a grep of
its `"host": ...` and `"started": ...,` bytes).

The entries resolve as the bash before this module resolved them: entries split on blanks; one with
`*`, `?` or `[` is a glob, expanded as bash expands it (hidden names only by a leading `.`, matches
in the locale's collation order), all its matches or with pick `newest` the one modified last (the
first of equals); a directory stands for every regular file under it, as `find DIR -type f |
LC_ALL=C sort` lists them (no symbolic link followed, the directory's own neither); a file named
or matched must be non-empty, a file found in a directory may be empty (a marker); the metrics
file never counts as a checkpoint file, and a file twice is kept once. A file's path relative to
the checkpoint dir goes into MANIFEST.json as is, so a quote, backslash or control character in
it, or bytes that are not UTF-8, refuse the sync. Nothing found is ever run or imported: the files
are read as bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ablate.remote.checkpoints.artifacts import is_glob, sha256_file
from ablate.remote.layout import MANIFEST

# A content-addressed file name's version (run_one.<sha12>.sh, run_queue.<sha12>.sh, <sha12>.env)
_SHA12 = re.compile(r"(?:run_one\.|run_queue\.)?([0-9a-f]{12})\.(?:sh|env)")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# `now`'s EPOCHREALTIME text, written into MANIFEST.json as it came (see `manifest_text`)
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_COUNT = re.compile(r"[0-9]+")
# [[:cntrl:]] of a UTF-8 locale (C0, DEL, C1, the line and paragraph separators)
_CNTRL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class SyncFailed(Exception):
    """The sync cannot go on; the message is its reason as run_one records it."""


def _nonempty_file(path: str) -> bool:
    """bash's `-s`: exists (links followed) with a size above zero."""
    try:
        return os.stat(path).st_size > 0
    except OSError:
        return False


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _collation() -> Callable[[str], Any]:
    """The sort key of bash's pathname expansion: strcoll in the environment's locale (C when it is
    not installed, as bash falls back), then the bytes."""
    import locale  # imported where used: only a glob needs it

    with contextlib.suppress(locale.Error):
        locale.setlocale(locale.LC_COLLATE, "")
    return lambda s: (locale.strxfrm(s), os.fsencode(s))


def glob_matches(ckpt_dir: str, entry: str) -> list[str]:
    """What `"$CKPT_DIR"/$entry` expands to (nullglob), relative to ckpt_dir, in bash's order."""
    import glob  # imported where used: most checkpoints are named plainly

    found = glob.glob(entry, root_dir=ckpt_dir)
    key = _collation()
    return sorted(found, key=lambda rel: key(f"{ckpt_dir}/{rel}"))


def newest(ckpt_dir: str, matches: Sequence[str]) -> str:
    """The match modified last, the first of equals (`[[ $m -nt $newest ]]`: nanoseconds, links
    followed, a match that cannot be stat'ed never newer)."""
    best, best_ns = matches[0], _mtime_ns(f"{ckpt_dir}/{matches[0]}")
    for rel in matches:
        ns = _mtime_ns(f"{ckpt_dir}/{rel}")
        if ns is not None and (best_ns is None or ns > best_ns):
            best, best_ns = rel, ns
    return best


def files_under(top: str) -> list[str]:
    """Every regular file under `top`, relative to it, as `find TOP -type f -print0 | LC_ALL=C sort
    -z` lists them: symbolic links are not followed, `top`'s own neither (a link lists nothing)."""
    if os.path.islink(top):
        return []
    out: list[str] = []
    todo = [""]
    while todo:
        sub = todo.pop()
        try:
            with os.scandir(f"{top}/{sub}" if sub else top) as it:
                for e in it:
                    rel = f"{sub}/{e.name}" if sub else e.name
                    if e.is_dir(follow_symlinks=False):
                        todo.append(rel)
                    elif e.is_file(follow_symlinks=False):
                        out.append(rel)
        except OSError:
            continue  # find says so on stderr and goes on
    return sorted(out, key=os.fsencode)


def _shown(rel: str) -> str:
    return _CNTRL.sub("?", rel)


def resolve(ckpt_dir: str, checkpoint: str, pick: str = "all", metrics: str = "") -> list[str]:
    """The files (relative to ckpt_dir) the checkpoint entries name now, in the order found."""
    found: list[str] = []
    seen: set[str] = set()

    def add(rel: str, in_dir: bool) -> None:
        if not in_dir and not _nonempty_file(f"{ckpt_dir}/{rel}"):
            raise SyncFailed(f"checkpoint {rel} missing or empty in {ckpt_dir}")
        if '"' in rel or "\\" in rel or _CNTRL.search(rel):
            raise SyncFailed(f"checkpoint file name {_shown(rel)} has a quote, backslash or control "
                             "character; rename it")
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            shown = rel.encode("utf-8", "replace").decode("utf-8")
            raise SyncFailed(f"checkpoint file name {shown} is not UTF-8; rename it") from None
        if rel in seen or rel == metrics:
            return
        seen.add(rel)
        found.append(rel)

    for entry in checkpoint.split():
        if is_glob(entry):  # run_one's `[[ $entry == *[*?[]* ]]`
            matches = glob_matches(ckpt_dir, entry)
            if not matches:
                raise SyncFailed(f"checkpoint {entry} matches nothing in {ckpt_dir}")
            if pick == "newest":
                matches = [newest(ckpt_dir, matches)]
        else:
            matches = [entry]
        for rel in matches:
            path = f"{ckpt_dir}/{rel}"
            if os.path.isdir(path):
                before = len(found)
                for f in files_under(path):
                    add(f"{rel}/{f}", in_dir=True)
                if len(found) == before:
                    raise SyncFailed(f"checkpoint directory {rel} has no files in {ckpt_dir}")
            elif os.path.isfile(path):
                add(rel, in_dir=False)
            else:
                raise SyncFailed(f"checkpoint {rel} missing or empty in {ckpt_dir}")
    return found


def copy_checked(src: str, staging: str, rel: str) -> dict[str, Any]:
    """`src` copied to `staging/rel`, then the copy's size and sha256 compared with the source's
    (each read again from its file); its MANIFEST.json entry."""
    dst = f"{staging}/{rel}"
    if "/" in rel:
        parent = dst.rsplit("/", 1)[0]
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise SyncFailed(f"cannot create {parent}: {e.strerror}") from None
    try:
        shutil.copyfile(src, dst)
    except OSError as e:
        raise SyncFailed(f"copy of {rel} to the shared FS failed: {e.strerror or e}") from None
    try:
        size, dsize = os.stat(src).st_size, os.stat(dst).st_size
    except OSError as e:
        raise SyncFailed(f"cannot stat {rel}: {e.strerror}") from None
    if size != dsize:
        raise SyncFailed(f"copy of {rel} is short: {dsize} of {size} bytes")
    try:
        want, got = sha256_file(src), sha256_file(dst)
    except OSError as e:
        raise SyncFailed(f"cannot hash {rel}: {e.strerror}") from None
    if want != got:
        raise SyncFailed(f"copy of {rel} differs from its source (sha256 {got}, expected {want})")
    return {"file": rel, "size": size, "sha256": want}


def sha12_of(file_name: str) -> str | None:
    m = _SHA12.fullmatch(file_name)
    return m.group(1) if m else None


def cfg_sha256(workdir: str, cfg: str) -> str | None:
    """The sha256 of the cell's config (relative to the workdir), None when it is not readable."""
    path = cfg if cfg.startswith("/") else f"{workdir}/{cfg}"
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):
        return None
    try:
        return sha256_file(path)
    except OSError:
        return None


class GitHead:
    """`git -C WORKDIR rev-parse HEAD`, started at once and read by `commit()`, so that it runs while
    the files are copied (posix_spawn: no `subprocess` to import where this is a Python start of
    its own)."""

    def __init__(self, workdir: str) -> None:
        self.pid = 0
        self.out = -1
        r, w = os.pipe()  # both close-on-exec; git's stdout is a dup2 of w
        try:
            self.pid = os.posix_spawnp("git", ["git", "-C", workdir, "rev-parse", "HEAD"], os.environ,
                                       file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                                     (os.POSIX_SPAWN_DUP2, w, 1),
                                                     (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
            self.out = r
        except OSError:  # no git: the commit is null
            os.close(r)
        finally:
            os.close(w)

    def commit(self) -> str | None:
        """Its answer, when it is a commit; None without git, outside a repository, on any failure."""
        if self.out < 0:
            return None
        with open(self.out, "rb") as f:
            self.out = -1
            raw = f.read()
        _, status = os.waitpid(self.pid, 0)
        text = raw.decode("ascii", "replace").rstrip("\n")  # as $(...) reads it
        return text if os.waitstatus_to_exitcode(status) == 0 and _COMMIT.fullmatch(text) else None


class Seconds(str):
    """An epoch time as `now` printed it (EPOCHREALTIME), a JSON number written as that very text."""


def manifest_text(fields: Mapping[str, Any]) -> str:
    """MANIFEST.json's one line: `fields` in their order, each value by json.dumps but `Seconds`,
    whose text is the number: a float's repr would drop trailing zeros (1732700000.12345 for
    1732700000.123450), and run_one's `ours` finds its run by the `"started": T,` bytes."""
    def value(v: Any) -> str:
        return str(v) if isinstance(v, Seconds) else json.dumps(v, ensure_ascii=False)

    return "{" + ", ".join(f"{json.dumps(k)}: {value(v)}" for k, v in fields.items()) + "}\n"


def publish(a: argparse.Namespace) -> None:
    """Every file copied and checked into a.staging, then MANIFEST.json; SyncFailed otherwise."""
    git = GitHead(a.workdir)
    try:
        stage(a, git)
    finally:
        git.commit()  # reaped on every path (a no-op once read)


def stage(a: argparse.Namespace, git: GitHead) -> None:
    """The checkpoint files, the metrics file and the log copied and checked, then MANIFEST.json."""
    ckpt = resolve(a.ckpt_dir, a.checkpoint, a.pick, a.metrics)
    if a.metrics and not (os.path.isfile(f"{a.ckpt_dir}/{a.metrics}")
                          and _nonempty_file(f"{a.ckpt_dir}/{a.metrics}")):
        raise SyncFailed(f"metrics {a.metrics} missing or empty in {a.ckpt_dir}")
    entries = [copy_checked(f"{a.ckpt_dir}/{rel}", a.staging, rel) for rel in ckpt]
    # One plain file configured and found: recorded as one object (as ever); else a list of them.
    artifacts: dict[str, Any] = {
        "checkpoint": entries[0] if len(ckpt) == 1 and ckpt[0] == a.checkpoint else entries}
    if a.metrics:
        artifacts["metrics"] = copy_checked(f"{a.ckpt_dir}/{a.metrics}", a.staging, a.metrics)
    artifacts["log"] = copy_checked(a.log, a.staging, f"{a.name}.log")
    fields = {
        "name": a.name, "cfg": a.cfg, "task": a.task, "epochs": a.epochs, "cat": a.cat,
        "cfg_sha256": cfg_sha256(a.workdir, a.cfg), "wrapper_version": sha12_of(a.wrapper),
        "run_queue_version": sha12_of(a.run_queue), "spec_version": sha12_of(a.spec),
        "host": a.host, "queue": a.queue, "commit": git.commit(),
        "started": a.started, "ended": a.ended, "resume": a.resume, "artifacts": artifacts,
    }
    try:
        with open(f"{a.staging}/{MANIFEST}", "w", encoding="utf-8") as f:
            f.write(manifest_text(fields))
    except OSError as e:
        raise SyncFailed(f"cannot write {MANIFEST} in {a.staging}: {e.strerror}") from None


def _seconds(text: str) -> Seconds:
    if not _SECONDS.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not epoch seconds: {text!r}")
    return Seconds(text)


def _count(text: str) -> int:
    if not _COUNT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="runner publish", description="run_one's sync: the checked copy "
                                 "of a cell's files into the staging dir, and its MANIFEST.json")
    ap.add_argument("--staging", required=True, help="the staging dir on the shared FS (it exists)")
    ap.add_argument("--ckpt-dir", required=True, help="the cell's {ckpt_dir}")
    ap.add_argument("--log", required=True, help="the cell's log, recorded as NAME.log")
    ap.add_argument("--checkpoint", required=True, help="ABLATE_CHECKPOINT: entries split on blanks")
    ap.add_argument("--pick", default="all", help="ABLATE_PICK: newest, else all")
    ap.add_argument("--metrics", default="", help="ABLATE_METRICS (empty: none)")
    ap.add_argument("--workdir", required=True, help="ABLATE_WORKDIR: the cfg's base, git's repository")
    ap.add_argument("--host", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--started", required=True, type=_seconds)
    ap.add_argument("--ended", required=True, type=_seconds)
    ap.add_argument("--wrapper", default="", help="run_one's file name (its version)")
    ap.add_argument("--run-queue", default="", help="ABLATE_RUN_QUEUE_VERSION: run_queue's file name")
    ap.add_argument("--spec", default="", help="ABLATE_SPEC_VERSION: the run spec's file name")
    for name in ("name", "cfg", "task"):
        ap.add_argument(name)
    ap.add_argument("epochs", type=_count)
    ap.add_argument("cat")
    ap.add_argument("resume", type=_count)
    return ap


def main(argv: Sequence[str], out: Callable[[str], None] | None = None) -> int:
    """0 published into the staging dir, 1 the sync failed (its reason one line on stdout, or to
    `out`: the served runner's answer), 2 bad arguments."""
    a = parser().parse_args(list(argv))
    try:
        publish(a)
    except SyncFailed as e:
        # One line, whatever a file name holds; bytes that are not UTF-8 as "?"
        line = _CNTRL.sub("?", str(e)).encode("utf-8", "replace")
        if out is not None:
            out(line.decode("utf-8"))
            return 1
        sys.stdout.buffer.write(line + b"\n")
        sys.stdout.flush()
        return 1
    return 0
