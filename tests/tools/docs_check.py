#!/usr/bin/python3
"""The repository names only what it ships.

  docs_check.py SOURCE_ROOT

Every Markdown file is parsed with markdown-it (Debian's python3-markdown-it, CommonMark with GFM
tables) and must have
  - every fenced code block closed by its own fence (an unclosed one swallows the rest of the file);
  - every line that starts with '|' inside a well-formed table (header, delimiter row of as many
    cells; otherwise the lines render as a paragraph of pipes);
  - every relative link and image pointing at a file or folder that exists;
  - every repository path written in backticks existing.
Every source comment (C++, CUDA, shell, Meson, Python) that names a repository path names one
that exists ('core/optim/zero.hpp', 'core/optim/fsdp.{hpp,cpp}', 'tests/test_*.cpp'), and no file
names a document the repository does not hold: the design or style notes of the team that writes it,
or the book's chapters as numbered files of a book folder (MISSING_DOCS below). Prints one line per problem, "FILE:LINE: what", and exits 1 if there is any; exits 77
(a skip for meson) where markdown-it is not installed.
"""
import glob
import os
import re
import sys

try:
    from markdown_it import MarkdownIt
except ImportError:
    print("python3-markdown-it is not installed (Debian's /usr/bin/python3): skipped")
    sys.exit(77)

TOP = ("core", "kernels", "chapters", "tests", "datasets", "docs", "bench", ".ci")
TOP_FILES = ("meson.build", "meson_options.txt", "README.md", "d2l")
SKIP_DIRS = {".git", "subprojects", "__pycache__"}
SOURCE_EXT = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".sh", ".py")
# A path as the text writes it: a top-level folder, then path characters; {a,b} and * allowed.
# Followed by '<' it is a pattern ("tests/test_<op>.cpp"), not a path.
PATH = re.compile(r"(?<![\w/.\-])((?:%s)/[\w./{},*+\-]*[\w*}+])(?![<\w])" % "|".join(re.escape(t) for t in TOP))
# What a reader cannot find here.
MISSING_DOCS = re.compile(r"\b(?:DESIGN|STYLE)[.]md\b|\bbook/0[0-9]{2}\b")


def expand(path):
    """'a/{b,c}.hpp' -> ['a/b.hpp', 'a/c.hpp'] (one level of braces at a time)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out += expand(path[: m.start()] + alt + path[m.end():])
    return out


def exists(root, path):
    """Whether every expansion of the path names something here: a file or folder, a file of that
    name with an extension (a program or module named by its stem: bench/zero_bench, core/cli), or,
    for a placeholder in capitals (bench/results/gpu-DATE) or a glob, at least one match."""
    path = path.rstrip(".,;:)")
    for p in expand(path):
        p = re.sub(r"(?<=[\-_/])[A-Z]{2,}\b", "*", p.split("#")[0])
        full = os.path.join(root, p)
        if not (glob.glob(full) or glob.glob(full + ".*")):
            return False
    return True


def walk(root):
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not (rel == "." and x.startswith("build")))
        for f in sorted(files):
            yield os.path.relpath(os.path.join(d, f), root)


def check_markdown(root, rel, problems):
    text = open(os.path.join(root, rel), encoding="utf-8").read()
    lines = text.split("\n")
    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(text)
    in_table = set()
    in_code = set()
    for t in tokens:
        if t.type == "table_open" and t.map:
            in_table.update(range(t.map[0], t.map[1]))
        if t.type in ("fence", "code_block") and t.map:
            in_code.update(range(t.map[0], t.map[1]))
        if t.type == "fence" and t.map:
            opening = lines[t.map[0]].strip()
            marker = re.match(r"(`{3,}|~{3,})", opening).group(1)
            closing = lines[t.map[1] - 1].strip() if t.map[1] - 1 > t.map[0] else ""
            if not (closing.startswith(marker[0] * len(marker)) and set(closing) <= {marker[0]}):
                problems.append("%s:%d: a code fence never closed (it runs to line %d)" % (rel, t.map[0] + 1, t.map[1]))
        if t.type == "inline":
            for c in t.children or []:
                href = c.attrs.get("href") if c.type == "link_open" else c.attrs.get("src") if c.type == "image" else None
                if href is None or re.match(r"[a-z]+:", href) or href.startswith("#"):
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(rel), href.split("#")[0]))
                if not os.path.exists(os.path.join(root, target)):
                    problems.append("%s:%d: the link '%s' points at nothing" % (rel, t.map[0] + 1, href))
                continue
            for c in t.children or []:
                if c.type == "code_inline":
                    for p in PATH.findall(c.content):
                        if not exists(root, p):
                            problems.append("%s:%d: `%s` names a path that does not exist" % (rel, t.map[0] + 1, p))
    for i, line in enumerate(lines):
        if line.lstrip().startswith("|") and i not in in_table and i not in in_code:
            problems.append("%s:%d: a table line outside any well-formed table" % (rel, i + 1))


def comments(rel, text):
    """(line number, comment text) of a source file."""
    hash_comments = rel.endswith((".sh", ".py")) or os.path.basename(rel) in ("meson.build", "d2l", "run")
    for i, line in enumerate(text.split("\n")):
        if hash_comments:
            at = line.find("#")
            if at >= 0 and not line.lstrip().startswith("#!"):
                yield i + 1, line[at + 1:]
        else:
            at = line.find("//")
            if at >= 0:
                yield i + 1, line[at + 2:]
            elif line.lstrip().startswith(("*", "/*")):
                yield i + 1, line


def main(root):
    problems = []
    for rel in walk(root):
        path = os.path.join(root, rel)
        if rel.endswith(".md"):
            check_markdown(root, rel, problems)
        name = os.path.basename(rel)
        if not (rel.endswith(SOURCE_EXT + (".md",)) or name in ("meson.build", "d2l", "run", "meson_options.txt")):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        if rel != "tests/tools/docs_check.py":
            for i, line in enumerate(text.split("\n")):
                for m in MISSING_DOCS.finditer(line):
                    problems.append("%s:%d: names %s, which the repository does not hold" % (rel, i + 1, m.group(0)))
        if rel.endswith(".md"):
            continue
        for line_no, comment in comments(rel, text):
            for p in PATH.findall(comment):
                if not exists(root, p):
                    problems.append("%s:%d: the comment names %s, which does not exist" % (rel, line_no, p))
    for p in problems:
        print(p)
    print("%d problem%s" % (len(problems), "" if len(problems) == 1 else "s"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
