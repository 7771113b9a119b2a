"""Every repository path a comment or a docs page names exists (docs/contributing/style.md).

What counts as a repository path, so that URLs, kernel files (/proc, /sys) and paths in
a container are never one:

- a token that starts with a top-level folder of this repository (`lens_ebpf/`, `tests/`,
  `docs/`, `deploy/`...), e.g. `lens_ebpf/recorder/store/leader.py`: it exists from the
  root;
- a token of folders and a file whose file name this repository has somewhere, or whose
  first folder it has and whose file is one of OUR_KINDS, e.g. `store/leader.py`: some
  file of the repository ends with it (another project's file is named with its project,
  `iovisor/bcc/tools/...`, or as a URL; the kernel's C files are none of ours);
- in a docs page, a relative link (`../agent/http.md`): it exists beside the page;
- a capitalised Markdown name (`BENCHMARKS.md`, and under a folder): the repository has
  it.

A token never starts right after a letter, a digit, `/`, `.`, `:`, `~`, `$` or `@` (so
`/proc/net/tcp`, `https://github.com/...` and `$HOME/.kube/config` are none), and one
followed by `<`, `*`, `{` or `[` is a pattern (`lens_ebpf/agent/bpf/programs/<name>.c`,
`tests/unit/test_*.py`), not a path. Comments are Python's comments and docstrings and the
comments of the C and shell sources under SOURCES."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("lens_ebpf", "tests", "bench", "scripts")
OUR_KINDS = ("py", "md", "yaml", "yml")
NOT_OURS = {"site", "build", "dist", "__pycache__", "node_modules"}
TOKEN = re.compile(r"(?<![\w./:~$@-])(?:\.{1,2}/)*[\w-]+(?:[./][\w-]+)*/?(?![<*{\[\w])")
CAPITALISED_MD = re.compile(r"(?:^|/)[A-Z][A-Z_-]*\.md$")
OUR_KIND = re.compile(r"\.(?:" + "|".join(OUR_KINDS) + r")$")


def ours(name: str) -> bool:
    return not name.startswith(".") and name not in NOT_OURS and not name.endswith(".egg-info")


def files() -> list[str]:
    """The repository's files, relative to the root, as posix paths."""
    out = []
    for here, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if ours(d)]
        rel = Path(here).relative_to(ROOT)
        out += [(rel / n).as_posix() for n in names if not n.endswith((".pyc", ".so"))]
    return out


TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and ours(p.name)}
FILES = files()
KNOWN = set(FILES)  # and every folder above a file
TAILS = set()  # every path a file of the repository ends with
FOLDER_NAMES, FILE_NAMES = set(), set()
for f in FILES:
    parts = f.split("/")
    KNOWN.update("/".join(parts[:i]) for i in range(1, len(parts)))
    TAILS.update("/".join(parts[i:]) for i in range(len(parts)))
    if not f.startswith("tests/fixtures/"):  # trees shaped like /proc and /sys
        FOLDER_NAMES.update(parts[:-1])
    FILE_NAMES.add(parts[-1])


def python_comments(text: str) -> Iterator[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                doc = body[0].value.value
                if isinstance(doc, str):
                    for i, line in enumerate(doc.splitlines()):
                        yield body[0].lineno + i, line


def c_comments(text: str) -> Iterator[tuple[int, str]]:
    for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S):
        first = text.count("\n", 0, m.start()) + 1
        for i, line in enumerate(m.group().splitlines()):
            yield first + i, line


def shell_comments(text: str) -> Iterator[tuple[int, str]]:
    for i, line in enumerate(text.splitlines(), 1):
        if "#" in line and not line.lstrip().startswith("#!"):
            yield i, line[line.index("#") :]


def named() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every comment under SOURCES and every docs page that names
    something missing() could report (the others are passed over unread: the speed)."""
    readers = {".py": python_comments, ".c": c_comments, ".h": c_comments, ".sh": shell_comments}
    for f in FILES:
        top, suffix = f.split("/")[0], Path(f).suffix
        page = (top == "docs" and suffix == ".md") or f in ("README.md", "BENCHMARKS.md")
        if not page and not (top in SOURCES and suffix in readers):
            continue
        text = (ROOT / f).read_text(errors="replace")
        if not reported(text, f):
            continue
        if page:
            yield from ((f, line, t) for line, t in enumerate(text.splitlines(), 1))
        else:
            yield from ((f, line, t) for line, t in readers[suffix](text))


def exists(token: str, where: str) -> bool | None:
    """Whether the path `token` (named in file `where`) exists; None: not a path."""
    path = token.rstrip("/")
    if token.startswith(("./", "../")):
        if not where.endswith(".md"):
            return None
        resolved = os.path.normpath(Path(where).parent / path)
        return resolved in KNOWN
    if "/" in path and path.split("/")[0] in TOP:
        return path in KNOWN
    parts = path.split("/")
    if CAPITALISED_MD.search(path):
        return path in TAILS
    ours = parts[-1] in FILE_NAMES or (parts[0] in FOLDER_NAMES and OUR_KIND.search(path))
    if len(parts) > 1 and "." in parts[-1].strip(".") and ours:
        return path in TAILS
    return None


def reported(text: str, where: str) -> list[str]:
    """The tokens of `text` (named in file `where`) that are repository paths and absent."""
    got = (m.group().rstrip(".-") for m in TOKEN.finditer(text))
    return [token for token in got if exists(token, where) is False]


def missing() -> list[str]:
    return [
        f"{where}:{line}: {token}"
        for where, line, text in named()
        for token in reported(text, where)
    ]


def test_every_path_a_comment_or_a_page_names_exists() -> None:
    gone = missing()
    assert not gone, f"{len(gone)} paths named and absent:\n" + "\n".join(gone)


def test_what_is_not_a_repository_path_is_never_reported() -> None:
    for text in (
        "see https://github.com/iovisor/bcc/blob/master/tools/tcplife.py",
        "reads /proc/net/tcp and /sys/class/infiniband/mlx5_0/ports/1/counters",
        "the kubeconfig at $HOME/.kube/config or ~/.kube/config",
        "one per program: lens_ebpf/agent/bpf/programs/<name>.c, tests/unit/test_*.py",
        "in the container /etc/lens-ebpf/config.yaml, /var/run/lens/x.sock",
        "the kernel's net/ipv4/tcp_ipv4.c and include/uapi/linux/btf.h",
        "iovisor/bcc/tools/tcplife.py, kubectl exec deployment/lens-ebpf-recorder",
    ):
        assert reported(text, "lens_ebpf/x.py") == [], text


def test_a_path_that_does_not_exist_is_reported() -> None:
    for token, where in (
        ("lens_ebpf/recorder/nowhere.py", "lens_ebpf/x.py"),
        ("tests/k8slab", "bench/x.py"),
        ("store/nowhere.py", "tests/x.py"),
        ("shared/METRICS.md", "docs/index.md"),
        ("STYLE.md", "lens_ebpf/x.py"),
        ("../nowhere/page.md", "docs/agent/index.md"),
    ):
        assert reported(f"as ({token}) says.", where) == [token], token
    assert reported("(../agent/http.md, store/leader.py, BENCHMARKS.md)", "docs/x/y.md") == []
