"""run_one's sync, the file work (ablate/remote/queue/publish.py), over real files in tmp_path: the
checkpoint entries resolved (a file, a list, a glob, `newest`, a directory with markers, the metrics
file left out), each failure's reason, and MANIFEST.json. The bash this module replaced is kept
below, verbatim, as the oracle: for the same files and arguments, the same reason, the same staged
files and the same MANIFEST.json bytes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ablate.remote.queue import publish

STARTED, ENDED = "1732700000.123450", "1732700061.000000"  # trailing zeros, as `now` prints them

# run_one.sh's sync before publish.py (ck_add, ck_resolve, the metrics check, copy_checked, the
# cfg's sha256, the commit, the versions and the printf), verbatim; `fail` prints the reason, exit 1.
OLD_BASH = r'''set -u
shopt -u patsub_replacement 2>/dev/null || true
CKPT_DIR=$1 STAGING=$2 LOG=$3 ABLATE_CHECKPOINT=$4 ABLATE_PICK=$5 ABLATE_METRICS=$6 ABLATE_WORKDIR=$7
ABLATE_HOST=$8 QUEUE=$9 STARTED=${10} ENDED=${11} SELF=${12} ABLATE_RUN_QUEUE_VERSION=${13}
ABLATE_SPEC_VERSION=${14} NAME=${15} CFG=${16} TASK=${17} EPOCHS=${18} CAT=${19} RESUME=${20}
fail() { printf '%s\n' "$1"; exit 1; }
ck_add() {  # ck_add PATH [in-dir]: one checkpoint file, once, by its path relative to CKPT_DIR
  local rel=${1#"$CKPT_DIR"/}
  # A file named (or matched) must have content; a directory may hold empty files (markers).
  [[ -n ${2-} || -s $1 ]] || fail "checkpoint $rel missing or empty in $CKPT_DIR"
  # Recorded in MANIFEST.json as is: no quote, backslash or control character to escape.
  [[ $rel == *[[:cntrl:]\"\\]* ]] && fail "checkpoint file name ${rel//[[:cntrl:]]/?} has a quote, backslash or control character; rename it"
  [[ -n ${CK_SEEN[$rel]-} || $rel == "${ABLATE_METRICS-}" ]] && return 0
  CK_SEEN[$rel]=1
  CK_FILES+=("$rel")
}
ck_resolve() {  # CK_FILES: the files ABLATE_CHECKPOINT's entries name now (docs/ARCHITECTURE.md)
  local entry m f newest n
  local -a entries matches
  CK_FILES=()
  declare -gA CK_SEEN=()
  read -ra entries <<<"$ABLATE_CHECKPOINT"
  for entry in "${entries[@]}"; do
    if [[ $entry == *[*?[]* ]]; then
      shopt -s nullglob
      # shellcheck disable=SC2206  # unquoted on purpose: expanded as a glob (entries hold no blanks)
      matches=("$CKPT_DIR"/$entry)
      shopt -u nullglob
      (( ${#matches[@]} )) || fail "checkpoint $entry matches nothing in $CKPT_DIR"
      if [[ ${ABLATE_PICK:-all} == newest ]]; then
        newest=${matches[0]}
        for m in "${matches[@]}"; do [[ $m -nt $newest ]] && newest=$m; done
        matches=("$newest")
      fi
    else
      matches=("$CKPT_DIR/$entry")
    fi
    for m in "${matches[@]}"; do
      if [[ -d $m ]]; then
        n=${#CK_FILES[@]}
        while IFS= read -r -d '' f; do ck_add "$f" in-dir; done < <(find "$m" -type f -print0 | LC_ALL=C sort -z)
        (( ${#CK_FILES[@]} > n )) || fail "checkpoint directory ${m#"$CKPT_DIR"/} has no files in $CKPT_DIR"
      elif [[ -f $m ]]; then
        ck_add "$m"
      else
        fail "checkpoint ${m#"$CKPT_DIR"/} missing or empty in $CKPT_DIR"
      fi
    done
  done
}
old_sync() {
  ck_resolve
  if [[ -n ${ABLATE_METRICS-} ]]; then
    [[ -f $CKPT_DIR/$ABLATE_METRICS && -s $CKPT_DIR/$ABLATE_METRICS ]] \
      || fail "metrics $ABLATE_METRICS missing or empty in $CKPT_DIR"
  fi
  copy_checked() {  # copy_checked SRC REL: its manifest entry in REPLY
    local src=$1 rel=$2 dst=$STAGING/$2 size dsize sum dsum
    if [[ $rel == */* ]]; then mkdir -p -- "${dst%/*}" || fail "cannot create ${dst%/*}"; fi
    cp -- "$src" "$dst" || fail "copy of $rel to the shared FS failed"
    size=$(stat -c %s -- "$src") && dsize=$(stat -c %s -- "$dst") || fail "cannot stat $rel"
    [[ $size == "$dsize" ]] || fail "copy of $rel is short: $dsize of $size bytes"
    sum=$(sha256sum -- "$src") && dsum=$(sha256sum -- "$dst") || fail "cannot hash $rel"
    sum=${sum%% *} dsum=${dsum%% *}
    [[ $sum == "$dsum" ]] || fail "copy of $rel differs from its source (sha256 $dsum, expected $sum)"
    REPLY="{\"file\": \"$rel\", \"size\": $size, \"sha256\": \"$sum\"}"
  }
  # One plain file configured and found: recorded as one object (as ever); else a list of them.
  local ck='' rel
  for rel in "${CK_FILES[@]}"; do
    copy_checked "$CKPT_DIR/$rel" "$rel"
    ck+="${ck:+, }$REPLY"
  done
  [[ ${#CK_FILES[@]} == 1 && ${CK_FILES[0]} == "$ABLATE_CHECKPOINT" ]] || ck="[$ck]"
  ARTIFACTS="\"checkpoint\": $ck"
  if [[ -n ${ABLATE_METRICS-} ]]; then
    copy_checked "$CKPT_DIR/$ABLATE_METRICS" "$ABLATE_METRICS"
    ARTIFACTS+=", \"metrics\": $REPLY"
  fi
  copy_checked "$LOG" "$NAME.log"
  ARTIFACTS+=", \"log\": $REPLY"

  cfg_path=$CFG
  [[ $CFG == /* ]] || cfg_path=$ABLATE_WORKDIR/$CFG
  cfg_sha=null
  if [[ -f $cfg_path && -r $cfg_path ]] && s=$(sha256sum -- "$cfg_path" 2>/dev/null); then
    cfg_sha="\"${s%% *}\""
  fi
  commit=null
  if command -v git >/dev/null 2>&1 && c=$(git -C "$ABLATE_WORKDIR" rev-parse HEAD 2>/dev/null) \
      && [[ $c =~ ^[0-9a-f]{40}$ ]]; then
    commit="\"$c\""
  fi
  sha12_of() {  # the version in a content-addressed file name (run_one.<sha12>.sh, <sha12>.env)
    if [[ $1 =~ ^(run_one\.|run_queue\.)?([0-9a-f]{12})\.(sh|env)$ ]]; then
      REPLY="\"${BASH_REMATCH[2]}\""
    else
      REPLY=null
    fi
  }
  sha12_of "$SELF"; v_one=$REPLY
  sha12_of "${ABLATE_RUN_QUEUE_VERSION-}"; v_queue=$REPLY
  sha12_of "${ABLATE_SPEC_VERSION-}"; v_spec=$REPLY

  printf '{"name": "%s", "cfg": "%s", "task": "%s", "epochs": %s, "cat": "%s", "cfg_sha256": %s, "wrapper_version": %s, "run_queue_version": %s, "spec_version": %s, "host": "%s", "queue": "%s", "commit": %s, "started": %s, "ended": %s, "resume": %s, "artifacts": {%s}}\n' \
    "$NAME" "$CFG" "$TASK" "$EPOCHS" "$CAT" "$cfg_sha" "$v_one" "$v_queue" "$v_spec" "$ABLATE_HOST" \
    "$QUEUE" "$commit" "$STARTED" "$ENDED" "$RESUME" "$ARTIFACTS" >"$STAGING/MANIFEST.json" \
    || fail "cannot write MANIFEST.json in $STAGING"
}
old_sync
'''  # noqa: E501  (verbatim: the bash's lines were this long)


class Cell:
    """One cell's files: its {ckpt_dir}, log, workdir with the cfg, and two staging dirs (old, new)."""

    def __init__(self, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.base = base
        self.capsys = capsys
        self.made = 0
        self.ckpt = base / "ckpt" / "c1"
        self.ckpt.mkdir(parents=True)
        self.log = base / "ckpt" / "c1.log"
        self.log.write_text("# ablate 1732700000.123450 host=h1\nepoch 1\n")
        self.workdir = base / "work"
        self.workdir.mkdir()
        (self.workdir / "cfgs").mkdir()
        (self.workdir / "cfgs" / "c1.yaml").write_text("lr: 0.1\n")

    def put(self, rel: str, data: bytes = b"weights", mtime_ns: int | None = None) -> Path:
        path = self.ckpt / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if mtime_ns is not None:
            os.utime(path, ns=(mtime_ns, mtime_ns))
        return path

    def args(self, staging: Path, checkpoint: str, pick: str = "all", metrics: str = "",
             cfg: str = "cfgs/c1.yaml", epochs: str = "3") -> list[str]:
        """publish's arguments, as run_one passes them."""
        return [f"--staging={staging}", f"--ckpt-dir={self.ckpt}", f"--log={self.log}",
                f"--checkpoint={checkpoint}", f"--pick={pick}", f"--metrics={metrics}",
                f"--workdir={self.workdir}", "--host=h1", "--queue=q1", f"--started={STARTED}",
                f"--ended={ENDED}", "--wrapper=run_one.0123456789ab.sh",
                "--run-queue=run_queue.ba9876543210.sh", "--spec=00112233aabb.env",
                "--", "c1", cfg, "recon", epochs, "sub", "0"]

    def staging(self, kind: str) -> Path:
        """A fresh staging dir, as run_one makes one."""
        self.made += 1
        d = self.base / "final_ckpts" / f".staging.c1.h1.{kind}{self.made}"
        d.mkdir(parents=True)
        return d

    def new(self, checkpoint: str, **kw: Any) -> tuple[int, str, Path]:
        """publish.main: its rc, the reason it printed, its staging dir."""
        staging = self.staging("new")
        self.capsys.readouterr()
        rc = publish.main(self.args(staging, checkpoint, **kw))
        return rc, self.capsys.readouterr().out, staging

    def old(self, checkpoint: str, pick: str = "all", metrics: str = "", cfg: str = "cfgs/c1.yaml",
            epochs: str = "3") -> tuple[int, str, Path]:
        """The bash it replaced, on the same files: rc, reason, staging dir."""
        staging = self.staging("old")
        argv = [str(self.ckpt), str(staging), str(self.log), checkpoint, pick, metrics, str(self.workdir),
                "h1", "q1", STARTED, ENDED, "run_one.0123456789ab.sh", "run_queue.ba9876543210.sh",
                "00112233aabb.env", "c1", cfg, "recon", epochs, "sub", "0"]
        p = subprocess.run(["bash", "-c", OLD_BASH, "old", *argv], capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout, staging

    def both(self, checkpoint: str, **kw: Any) -> tuple[int, str, dict[str, bytes]]:
        """Old and new on the same files, compared: (rc, reason, staged files) when equal."""
        rc, reason, staging = self.new(checkpoint, **kw)
        old_rc, old_reason, old_staging = self.old(checkpoint, **kw)
        got, want = staged(staging), staged(old_staging)
        assert (rc, reason, got) == (old_rc, old_reason, want), (reason, old_reason)
        return rc, reason, got


def staged(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def checkpoint(files: dict[str, bytes]) -> Any:
    return json.loads(files["MANIFEST.json"])["artifacts"]["checkpoint"]


def names(ck: Any) -> list[str]:
    return [e["file"] for e in (ck if isinstance(ck, list) else [ck])]


@pytest.fixture
def cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cell:
    return Cell(tmp_path, capsys)


def test_one_plain_file_is_recorded_as_one_object(cell: Cell) -> None:
    cell.put("best.pth", b"x" * 1000)
    rc, reason, files = cell.both("best.pth")
    assert (rc, reason) == (0, "")
    ck = checkpoint(files)
    assert isinstance(ck, dict) and ck["file"] == "best.pth" and ck["size"] == 1000
    assert files["best.pth"] == b"x" * 1000 and files["c1.log"] == cell.log.read_bytes()


def test_a_list_of_files_is_a_list_in_the_order_configured(cell: Cell) -> None:
    cell.put("model.bin")
    cell.put("optim.bin", b"o")
    _, _, files = cell.both("optim.bin model.bin")
    assert names(checkpoint(files)) == ["optim.bin", "model.bin"]


def test_a_glob_takes_every_match_in_order_and_newest_the_last_modified(cell: Cell) -> None:
    t = 1_700_000_000_000_000_000
    cell.put("epoch=1.ckpt", mtime_ns=t + 4)
    cell.put("epoch=2.ckpt", mtime_ns=t + 5)  # newer by one nanosecond
    cell.put("epoch=10.ckpt", mtime_ns=t + 5)  # as new, and first in order: the first of equals
    cell.put(".epoch=3.ckpt", mtime_ns=t + 9)  # hidden: `*` never matches a leading dot
    cell.put("last.ckpt", mtime_ns=t + 9)
    _, _, files = cell.both("epoch=*.ckpt")
    assert names(checkpoint(files)) == ["epoch=1.ckpt", "epoch=10.ckpt", "epoch=2.ckpt"]
    _, _, files = cell.both("epoch=*.ckpt", pick="newest")
    assert names(checkpoint(files)) == ["epoch=10.ckpt"]  # one match of a glob: still a list
    _, _, files = cell.both("epoch=[0-9].ckpt", pick="newest")
    assert names(checkpoint(files)) == ["epoch=2.ckpt"]
    _, _, files = cell.both("epoch=?.ckpt .e*")
    assert names(checkpoint(files)) == ["epoch=1.ckpt", "epoch=2.ckpt", ".epoch=3.ckpt"]


def test_a_directory_is_every_regular_file_under_it_in_byte_order_markers_included(cell: Cell) -> None:
    for rel in ("hf/model-00002-of-00002.safetensors", "hf/model-00001-of-00002.safetensors",
                "hf/model.safetensors.index.json", "hf/sub/x.bin", "hf/sub-y.bin", "hf/B.bin",
                "hf/.hidden/h.bin"):
        cell.put(rel)
    cell.put("hf/.done", b"")  # a marker: empty, fine inside a directory
    cell.put("elsewhere.bin")
    (cell.ckpt / "hf" / "link.bin").symlink_to(cell.ckpt / "elsewhere.bin")  # find -type f: not a file
    (cell.ckpt / "hf" / "linkdir").symlink_to(cell.ckpt / "hf" / "sub")  # never followed
    _, _, files = cell.both("hf")
    assert names(checkpoint(files)) == [
        "hf/.done", "hf/.hidden/h.bin", "hf/B.bin", "hf/model-00001-of-00002.safetensors",
        "hf/model-00002-of-00002.safetensors", "hf/model.safetensors.index.json", "hf/sub-y.bin",
        "hf/sub/x.bin"]
    assert files["hf/.done"] == b""


def test_globbed_directories_newest_and_across_segments(cell: Cell) -> None:
    t = 1_700_000_000_000_000_000
    for step, ns in (("global_step100", t + 1), ("global_step200", t)):
        cell.put(f"{step}/mp_rank_00_model_states.pt")
        cell.put(f"{step}/zero_pp_rank_0_optim_states.pt")
        os.utime(cell.ckpt / step, ns=(ns, ns))
    _, _, files = cell.both("global_step*", pick="newest")
    assert names(checkpoint(files)) == ["global_step100/mp_rank_00_model_states.pt",
                                        "global_step100/zero_pp_rank_0_optim_states.pt"]
    _, _, files = cell.both("global_step*/mp_rank_*")
    assert names(checkpoint(files)) == ["global_step100/mp_rank_00_model_states.pt",
                                        "global_step200/mp_rank_00_model_states.pt"]


def test_the_metrics_file_is_never_a_checkpoint_file_and_a_file_counts_once(cell: Cell) -> None:
    cell.put("out/model.bin")
    cell.put("out/metrics.json", b'{"acc": 0.9}')
    _, _, files = cell.both("out out/model.bin", metrics="out/metrics.json")
    m = json.loads(files["MANIFEST.json"])
    assert names(m["artifacts"]["checkpoint"]) == ["out/model.bin"]
    assert m["artifacts"]["metrics"]["file"] == "out/metrics.json" and list(m["artifacts"]) == [
        "checkpoint", "metrics", "log"]
    # the metrics file alone under a directory: the directory "has no files"
    cell.put("m/metrics.json", b"{}")
    rc, reason, _ = cell.both("m", metrics="m/metrics.json")
    assert rc == 1 and reason == f"checkpoint directory m has no files in {cell.ckpt}\n"


@pytest.mark.parametrize(("setup", "entries", "metrics", "reason"), [
    ({}, "best.pth", "", "checkpoint best.pth missing or empty in {ckpt}"),
    ({"best.pth": b""}, "best.pth", "", "checkpoint best.pth missing or empty in {ckpt}"),
    ({"a.bin": b"a"}, "a.bin adapter_*.bin", "", "checkpoint adapter_*.bin matches nothing in {ckpt}"),
    ({"e/.keep": b"x"}, "e/.keep e", "", "checkpoint directory e has no files in {ckpt}"),
    ({"d/ok.bin": b"x", 'd/a"b.bin': b"x"}, "d", "",
     'checkpoint file name d/a"b.bin has a quote, backslash or control character; rename it'),
    ({"d/a\\b.bin": b"x"}, "d", "",
     "checkpoint file name d/a\\b.bin has a quote, backslash or control character; rename it"),
    ({"d/a\nb.bin": b"x"}, "d", "",
     "checkpoint file name d/a?b.bin has a quote, backslash or control character; rename it"),
    ({"best.pth": b"x"}, "best.pth", "metrics.json", "metrics metrics.json missing or empty in {ckpt}"),
    ({"best.pth": b"x", "metrics.json": b""}, "best.pth", "metrics.json",
     "metrics metrics.json missing or empty in {ckpt}"),
])
def test_each_failure_gives_the_reason_the_bash_gave(cell: Cell, setup: dict[str, bytes], entries: str,
                                                     metrics: str, reason: str) -> None:
    for rel, data in setup.items():
        cell.put(rel, data)
    rc, got, files = cell.both(entries, metrics=metrics)
    assert (rc, got) == (1, reason.format(ckpt=cell.ckpt) + "\n")
    assert "MANIFEST.json" not in files


def test_manifest_keys_order_types_and_bytes_as_the_printf_wrote_them(cell: Cell) -> None:
    cell.put("best.pth", b"w" * 10)
    cell.put("metrics.json", b'{"acc": 1}')
    _, _, files = cell.both("best.pth", metrics="metrics.json")
    raw = files["MANIFEST.json"]
    m = json.loads(raw)
    assert list(m) == ["name", "cfg", "task", "epochs", "cat", "cfg_sha256", "wrapper_version",
                       "run_queue_version", "spec_version", "host", "queue", "commit", "started", "ended",
                       "resume", "artifacts"]
    assert [type(m[k]) for k in m] == [str, str, str, int, str, str, str, str, str, str, str, type(None),
                                       float, float, int, dict]
    assert (m["wrapper_version"], m["run_queue_version"], m["spec_version"]) == (
        "0123456789ab", "ba9876543210", "00112233aabb")
    assert m["started"] == float(STARTED) and m["ended"] == float(ENDED)
    # run_one's `ours` finds its run by these bytes: the number as `now` printed it
    assert b'"host": "h1"' in raw and f'"started": {STARTED},'.encode() in raw
    assert raw.endswith(b"}}\n") and raw.count(b"\n") == 1


def test_manifest_without_a_readable_cfg_and_with_a_commit(cell: Cell) -> None:
    cell.put("best.pth")
    git = ["git", "-C", str(cell.workdir), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    _, _, files = cell.both("best.pth", cfg="cfgs/none.yaml", epochs="20")
    m = json.loads(files["MANIFEST.json"])
    assert (m["commit"], m["cfg_sha256"], m["epochs"]) == (head, None, 20)


def test_odd_but_safe_names_make_valid_json_byte_for_byte_the_bash_s(cell: Cell) -> None:
    odd = ["a b.bin", "é-ü.bin", "$HOME.bin", "100%s.bin", "it's.bin", "*.bin", "-n.bin", "#1.bin",
           "~t.bin", "[x].bin", "a&b;c|d.bin", "日本.bin", "{}.bin"]
    for name in odd:
        cell.put(f"d/{name}", name.encode())
    _, _, files = cell.both("d")
    ck = checkpoint(files)
    assert sorted(names(ck)) == sorted(f"d/{n}" for n in odd)
    assert all(files[e["file"]] == e["file"][2:].encode() for e in ck)


def test_a_symlink_named_as_the_checkpoint_is_copied_and_checked_as_its_target(cell: Cell) -> None:
    """The bash compared `stat -c %s` of the link (its target's path length) with the copy's size;
    the sizes compared now are the bytes copied."""
    cell.put("runs/7/best.pth", b"t" * 4096)
    (cell.ckpt / "best.pth").symlink_to("runs/7/best.pth")
    rc, reason, staging = cell.new("best.pth")
    assert (rc, reason) == (0, "")
    ck = checkpoint(staged(staging))
    assert ck["size"] == 4096 and (staging / "best.pth").read_bytes() == b"t" * 4096
    assert not (staging / "best.pth").is_symlink()


def test_a_file_name_that_is_not_utf8_is_refused(cell: Cell) -> None:
    """Raw into MANIFEST.json, as the bash wrote it, no JSON reader could read the result."""
    (cell.ckpt / "d").mkdir()
    (cell.ckpt / "d" / os.fsdecode(b"caf\xe9.bin")).write_bytes(b"x")
    rc, reason, staging = cell.new("d")
    assert rc == 1 and reason == "checkpoint file name d/caf?.bin is not UTF-8; rename it\n"
    assert not (staging / "MANIFEST.json").exists()


def test_a_failed_copy_names_the_file_and_the_error(cell: Cell, tmp_path: Path) -> None:
    cell.put("best.pth")
    args = cell.args(tmp_path / "gone" / "staging", "best.pth")
    cell.capsys.readouterr()
    assert publish.main(args) == 1
    assert cell.capsys.readouterr().out == (
        "copy of best.pth to the shared FS failed: No such file or directory\n")


def test_bad_arguments_exit_2_before_any_copy(cell: Cell) -> None:
    cell.put("best.pth")
    staging = cell.staging("new")
    with pytest.raises(SystemExit) as e:
        publish.main(cell.args(staging, "best.pth", epochs="3x"))
    assert e.value.code == 2 and list(staging.iterdir()) == []
    for bad in ("1,5", "1e9", ""):
        with pytest.raises(SystemExit):
            publish.main([a if not a.startswith("--started=") else f"--started={bad}"
                          for a in cell.args(staging, "best.pth")])


def test_nothing_in_the_checkpoint_is_run(cell: Cell) -> None:
    """Executables, a `git` and Python files among the checkpoint files are copied as bytes."""
    marker = cell.base / "ran"
    for rel in ("d/git", "d/run.sh", "d/__main__.py", "d/sitecustomize.py"):
        p = cell.put(rel, f"#!/bin/sh\ntouch {marker}\n".encode())
        p.chmod(0o755)
    rc, _, staging = cell.new("d")
    assert rc == 0 and not marker.exists()
    assert (staging / "d" / "git").read_bytes().startswith(b"#!/bin/sh")
