"""Run the shell commands README.md and BENCHMARKS.md give, as written, and report failures.

    python scripts/check_docs_commands.py            # the cheap commands (minutes)
    python scripts/check_docs_commands.py --all      # every runnable one (hours; GPU ones need CUDA)
    python scripts/check_docs_commands.py --list     # each command, its kind, nothing run

Commands: each line of a ``sh`` / ``bash`` code block, and each inline code span that starts
like a command (``python``, ``reshard``, ``torchrun``, ``scripts/``, ``pip``, ``. .venv``,
``VAR=value`` before one of those).  ``KINDS`` gives every command a kind (the first pattern
that matches; ``ReshardError``-free: a command no pattern matches is a failure of its own, so
a new command in the docs must be classified):

* ``cheap``: runs by default;
* ``long``: runs with ``--all`` (the full test suite, the deep fuzzers, real-size benchmarks,
  installs);
* ``gpu``: runs with ``--all`` where ``torch.cuda.is_available()``, else reported skipped;
* ``template``: a syntax line with placeholders (``FILE.py``, ``[--family F]``, ``N``), never run.

Every command runs with ``bash -c`` in one scratch copy of the repository's tracked files (so
commands that write, ``--write``, ``--draw``, ``--out``, leave the checkout as it was), in the
documents' order, each under ``--timeout`` seconds, with the scratch copy's ``.venv`` first on
``PATH``: the README's install command makes it (``--all``), else it is this interpreter's
venv, linked, and a ``pip install`` is then skipped (it would change this environment).  Exit
status 1 when any command that ran failed or a command is unclassified.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "BENCHMARKS.md")

#: an inline code span that is a command
_COMMAND = re.compile(r"(python3? |reshard |torchrun |scripts/\S+\.(sh|py)|pip |\. \.venv|[A-Z_]+=\S* (python|reshard))")

#: (pattern searched in the command, kind, why), the first match wins
KINDS: tuple[tuple[str, str, str], ...] = (
    (r"\bFILE\b| \[[^]]*\]|\bX\.py\b| N |nproc-per-node 2 train\.py", "template", "a syntax line with placeholders"),
    (r"^reshard tune$", "long", "measures this machine's collectives and kernels (minutes)"),
    (r"scripts/gpu_|scripts/device_|bench_transpose|bench_gelu|bench_fusion|bench_launch_overhead|bench_matmul_align|tune_cost_model|train_step_gpu",
     "gpu", "measures a GPU"),
    (r"pip install|python3 -m venv", "long", "installs packages"),
    (r"-m pytest -q( -n \d+ --dist loadfile)?( --durations=\d+)?$|deep_fuzz|compat_check\.py", "long", "the whole test suite, a stack's tests or the deep fuzzers (tens of minutes to hours)"),
    (r"check_docs_commands\.py", "long", "runs the documents' commands itself (minutes)"),
    (r"real_models\.py (--full|--models|--time-limit)|optimize_speed\.py|extractor_gap\.py --n 300|"
     r"plan_quality\.py --write|train_scale\.py|tests/fuzz/test_fuzz\.py|bench_remap_form|train_dtensor\.py|"
     r"aten_coverage\.py|hf_architectures\.py|train_tiny\.py|symbolic_suite\.py|layer_bytes\.py", "long",
     "a real-size benchmark, a sweep or a fuzz run"),
    (r"^reshard |^torchrun |^python3? (benchmarks|examples)/|^PYTHONPATH=", "cheap", "seconds to a few minutes"),
)


@dataclass(frozen=True)
class Command:
    """A command of a document: its text, where it is (file:line), its kind and why."""

    text: str
    where: str
    kind: str
    why: str


def commands(root: Path = ROOT) -> list[Command]:
    """Every command of ``DOCS`` in order: code-block lines first-to-last with the inline
    spans, by line; a span repeated in the same document is listed once."""
    out: list[Command] = []
    for doc in DOCS:
        text = (root / doc).read_text()
        found: list[tuple[int, str]] = []
        for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S):
            if m.group(1) in ("sh", "bash", "shell"):
                line = text[:m.start()].count("\n") + 2
                for k, cmd in enumerate(m.group(2).replace("\\\n", " ").splitlines()):
                    if cmd.strip() and not cmd.lstrip().startswith("#"):
                        found.append((line + k, cmd.strip()))
        prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        for m in re.finditer(r"`([^`\n]+)`", prose):
            if _COMMAND.match(m.group(1)):
                found.append((prose[:m.start()].count("\n") + 1, m.group(1).strip()))
        seen: set[str] = set()
        for line, cmd in sorted(found):
            if cmd not in seen:
                seen.add(cmd)
                out.append(Command(cmd, f"{doc}:{line}", *kind_of(cmd)))
    return out


def kind_of(cmd: str) -> tuple[str, str]:
    """``cmd``'s (kind, why) from ``KINDS``; ("unclassified", ...) when no pattern matches."""
    for pattern, kind, why in KINDS:
        if re.search(pattern, cmd):
            return kind, why
    return "unclassified", "no pattern of KINDS matches: classify it in scripts/check_docs_commands.py"


def selected(cmds: list[Command], run_all: bool, cuda: bool) -> list[tuple[Command, str | None]]:
    """Each command with None (run it) or why it is skipped."""
    wanted = {"cheap"} | ({"long", "gpu"} if run_all else set())
    out = []
    for c in cmds:
        if c.kind == "gpu" and run_all and not cuda:
            out.append((c, "needs a CUDA GPU"))
        elif c.kind in wanted or c.kind == "unclassified":
            out.append((c, None))
        else:
            out.append((c, f"{c.kind}: {c.why}" + ("" if c.kind == "template" else " (--all runs it)")))
    return out


def scratch_copy(dest: Path) -> None:
    """The repository's tracked (and untracked, not ignored) files copied into ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run(plan: list[tuple[Command, str | None]], timeout_s: float) -> int:
    """Run the selected commands in a scratch copy; print one line each and every failure's
    output tail; the number of failures."""
    failures = 0
    with tempfile.TemporaryDirectory(prefix="reshard-docs-") as tmp:
        work = Path(tmp)
        scratch_copy(work)
        own_venv = any(skip is None and "python3 -m venv" in c.text for c, skip in plan)
        if not own_venv and sys.prefix != sys.base_prefix:
            (work / ".venv").symlink_to(sys.prefix)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), *filter(None, [os.environ.get("PYTHONPATH")])]),
               "VIRTUAL_ENV": str(work / ".venv"), "PATH": f"{work / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        for c, skip in plan:
            if skip is None and "pip install" in c.text and "python3 -m venv" not in c.text and not own_venv:
                skip = "would install into this interpreter's environment: runs after the README's venv command"
            if skip is not None:
                print(f"skip  {c.where:16} {c.text}  [{skip}]")
                continue
            if c.kind == "unclassified":
                failures += 1
                print(f"FAIL  {c.where:16} {c.text}  [{c.why}]")
                continue
            start = time.monotonic()
            try:
                res = subprocess.run(["bash", "-c", c.text], cwd=work, env=env, capture_output=True, text=True,
                                     timeout=timeout_s)
                ok, output = res.returncode == 0, res.stdout + res.stderr
                status = "ok" if ok else f"exit {res.returncode}"
            except subprocess.TimeoutExpired as e:
                ok, status = False, f"timed out after {timeout_s:.0f} s (--timeout)"
                output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                                 for x in (e.stdout, e.stderr))
            print(f"{'ok' if ok else 'FAIL':5} {c.where:16} {c.text}  [{time.monotonic() - start:.0f} s]", flush=True)
            if not ok:
                failures += 1
                tail = "\n".join(output.strip().splitlines()[-25:])
                print(f"      {status}; last lines:\n" + "\n".join(f"      | {x}" for x in tail.splitlines()), flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="also the long and GPU commands")
    ap.add_argument("--list", action="store_true", help="list the commands and their kinds; run nothing")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per command (default 900)")
    ap.add_argument("--only", default=None, help="run only the commands containing this text")
    args = ap.parse_args(argv)
    cmds = commands()
    if args.only is not None:
        cmds = [c for c in cmds if args.only in c.text]
    if args.list:
        for c in cmds:
            print(f"{c.kind:12} {c.where:16} {c.text}")
        return int(any(c.kind == "unclassified" for c in cmds))
    import torch

    failures = run(selected(cmds, args.all, torch.cuda.is_available()), args.timeout)
    print(f"{failures} failed" if failures else "every command run succeeded")
    return int(failures > 0)


if __name__ == "__main__":
    sys.exit(main())
