"""The docs against the code, so they cannot drift: the flag tables of docs/usage.md,
an entry in docs/troubleshooting.md for every error message, every path, module and
`make` target README.md, BUILD_NOTES.md and docs/*.md name, every path the code's own
comments and messages name, the commits they cite, an entry for every Horovod patch, a
report behind every row of the README's results, and the README's length.

Fast: reads source with `ast`, and defines each entry point's flags in a child
process (no TensorFlow is imported for that).
"""

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "BUILD_NOTES.md", *sorted((ROOT / "docs").glob("*.md"))]

# Each of these headings (of docs/usage.md, unless named) holds a table with one `--flag`
# per row, and together they must name exactly the flags the module defines.
FLAG_TABLES = {
    "Training flags": ("hvd_mnist.train_flags", "hvd_mnist.train_flags"),
    "Flags of prepare": ("hvd_mnist.prepare", "hvd_mnist.prepare"),
    "Flags of predict": ("hvd_mnist.predict", "hvd_mnist.predict"),
    "Flags of verify": ("hvd_mnist.verify", "hvd_mnist.verify"),
    # Flags of the tests' launcher, not of the product.
    "Testing aids": ("tests.with_aids", "tests.with_aids", "architecture.md"),
}
# What a user-facing error is: these exceptions end as one line (`hvd_mnist: error: ...`,
# `prepare: error: ...`, or absl's usage error).
ERROR_CLASSES = {"UserFacingError", "DataError", "CollectiveError", "UsageError"}
# The literal runs of a message this long or longer must appear in its entry.
MIN_FRAGMENT = 8
# Prose inside quoted error messages ("make it again with: make data") is not a target,
# nor the next package of a list of Debian packages ("gcc g++ cmake make patch").
NOT_TARGETS = {"it", "the", "them", "a", "sure", "patch"}


def text_of(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8")


def normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\\|", "|"))


def sections(markdown: str) -> dict:
    """Heading text (## or ###) -> the text under it, up to the next heading."""
    parts = re.split(r"^#{2,3} (.+)$", markdown, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


# ---------------------------------------------------------------- flags

def flags_by_module(entry_point: str) -> dict:
    code = ("import importlib, json, sys; from absl import flags; "
            "importlib.import_module(sys.argv[1]).define_flags(); "
            "print(json.dumps({m: sorted(f.name for f in fs) for m, fs in "
            "flags.FLAGS.flags_by_module_dict().items()}))")
    out = subprocess.run([sys.executable, "-c", code, entry_point], capture_output=True,
                         text=True, check=True, timeout=60, cwd=ROOT)
    return json.loads(out.stdout)


def table_flags(section: str) -> list:
    return re.findall(r"^\|\s*`--([a-z0-9_]+)`", section, flags=re.M)


@pytest.mark.parametrize("heading", sorted(FLAG_TABLES))
def test_flag_table_names_exactly_the_flags_the_code_defines(heading):
    entry_point, module, *doc = FLAG_TABLES[heading]
    page = f"docs/{doc[0] if doc else 'usage.md'}"
    page_sections = sections(text_of(ROOT / page))
    assert heading in page_sections, f"{page} has no section '{heading}'"
    documented = table_flags(page_sections[heading])
    defined = flags_by_module(entry_point).get(module, [])
    assert defined, f"{module} defines no flags: is FLAG_TABLES out of date?"
    assert len(documented) == len(set(documented)), f"a flag is listed twice: {documented}"
    missing = sorted(set(defined) - set(documented))
    unknown = sorted(set(documented) - set(defined))
    assert not missing, f"{page} '{heading}' lacks {missing}"
    assert not unknown, f"{page} '{heading}' names flags {module} does not define: {unknown}"


# ---------------------------------------------------------------- errors

def literal_pieces(node, templates: dict) -> list:
    """The literal runs of a message expression: a string, an f-string, a sum of them,
    or NAME.format(...) of a template assigned in the same function."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.split(r"\{[a-z_]*\}", node.value)
    if isinstance(node, ast.JoinedStr):
        return [piece for value in node.values for piece in literal_pieces(value, templates)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return literal_pieces(node.left, templates) + literal_pieces(node.right, templates)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format" and isinstance(node.func.value, ast.Name)
            and node.func.value.id in templates):
        return literal_pieces(templates[node.func.value.id], templates)
    return []


def error_messages():
    """(where, pieces) for every user-facing error message and flag validator message:
    its literal runs of MIN_FRAGMENT characters or more."""
    found = {}
    for path in sorted((ROOT / "hvd_mnist").rglob("*.py")):
        tree = ast.parse(text_of(path))
        # Outer scopes first (ast.walk is breadth-first), so a call's innermost function
        # is the last to record it, with that function's templates.
        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))]
        for scope in scopes:
            templates = {target.id: node.value for node in ast.walk(scope)
                         if isinstance(node, ast.Assign)
                         for target in node.targets if isinstance(target, ast.Name)}
            for node in ast.walk(scope):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                messages = [node.args[0]] if name in ERROR_CLASSES and node.args else []
                messages += [k.value for k in node.keywords if k.arg == "message"]
                for message in messages:
                    pieces = [p.strip() for p in literal_pieces(message, templates)]
                    found[f"{path.relative_to(ROOT)}:{node.lineno}"] = [
                        p for p in pieces if len(p) >= MIN_FRAGMENT]
    return sorted((where, pieces) for where, pieces in found.items() if pieces)


def test_the_error_scan_finds_the_messages_it_should():
    fragments = {piece for _, pieces in error_messages() for piece in pieces}
    assert len(fragments) > 40
    assert "is not divisible by the" in " ".join(fragments)
    assert "--resume is supported by --mode=custom only" in fragments  # a validator message
    assert any("does not match the TFDS files it was made from" in f for f in fragments)


def test_every_error_message_has_a_troubleshooting_entry():
    page = normalized(text_of(ROOT / "docs" / "troubleshooting.md"))
    missing = [f"{where}: {piece!r}" for where, pieces in error_messages()
               for piece in pieces if normalized(piece) not in page]
    assert not missing, "docs/troubleshooting.md has no entry for:\n" + "\n".join(missing)


# ---------------------------------------------------------------- paths and targets

def code_text(markdown: str) -> str:
    """The text of fenced blocks and inline code spans."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.M | re.S)
    rest = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return "\n".join(fenced + re.findall(r"`([^`\n]+)`", rest))


def make_targets() -> set:
    return set(re.findall(r"^([a-z][\w-]*):", text_of(ROOT / "Makefile"), flags=re.M))


def test_make_targets_the_docs_name_exist():
    targets = make_targets()
    assert {"train", "test", "setup", "data"} <= targets
    wrong = [f"{doc.relative_to(ROOT)}: make {name}" for doc in DOCS
             for name in re.findall(r"(?<![\w-])make ([a-z][\w-]*)", code_text(text_of(doc)))
             if name not in targets | NOT_TARGETS]
    assert not wrong, "no such make target:\n" + "\n".join(wrong)


REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:hvd_mnist|tools|reports|tests|docs|deploy|\.ci)/[\w./-]*[\w/]"
    r"|(?:Makefile|BUILD_NOTES\.md|setup\.cfg|pyproject\.toml|LICENSE)\b)")


def mentions(pattern: str):
    """(doc, match) for every match of `pattern` in README.md and docs/*.md."""
    return [(doc, match) for doc in DOCS for match in re.findall(pattern, text_of(doc))]


# A path that goes on as a pattern (tools/pins/tf<TF>.txt, tools/horovod-patches/keras3-*.patch,
# reports/horovod_suite$(...)) or ends in a placeholder in capitals (horovod-patches/NAME).
PATTERN_GOES_ON = re.compile(r"[\w./-]*[<$*{\[]")
PLACEHOLDER = re.compile(r"/[A-Z]+$")


def missing_paths(text: str) -> list:
    """The repository paths `text` names that do not exist, patterns left out."""
    return [match.group(1) for match in REPO_PATH.finditer(text)
            if not (PATTERN_GOES_ON.match(text, match.end()) or PLACEHOLDER.search(match.group(1))
                    or (ROOT / match.group(1)).exists())]


def test_repository_paths_the_docs_name_exist():
    wrong = [f"{doc.relative_to(ROOT)}: {path}" for doc in DOCS
             for path in missing_paths(text_of(doc))]
    assert not wrong, "no such file:\n" + "\n".join(wrong)


# Where code names a file: its comments, docstrings and messages.
SOURCES = ("*.py", "*.sh", "*.txt", "*.patch", "Makefile", "setup.cfg", ".ci/run")
# Files whose paths are data, not references: {file: why}.
PATHS_AS_DATA = {"tests/test_bench_tools.py": "the report names a partial bench run would write"}


def test_repository_paths_the_code_names_exist():
    sources = subprocess.run(["git", "ls-files", *SOURCES], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    wrong = [f"{source}: {path}" for source in sources if source not in PATHS_AS_DATA
             for path in missing_paths(text_of(ROOT / source))]
    assert not wrong, "no such file:\n" + "\n".join(sorted(set(wrong)))


def anchors(markdown: str) -> set:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as -."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


def test_relative_links_resolve():
    wrong = []
    for doc, target in mentions(r"\]\(([^)\s]+)\)"):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        page = (doc.parent / path).resolve() if path else doc
        if not page.exists():
            wrong.append(f"{doc.relative_to(ROOT)}: {target}")
        elif anchor and page.exists() and page.suffix == ".md" and anchor not in anchors(
                text_of(page)):
            wrong.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not wrong, "links to nothing:\n" + "\n".join(wrong)


def test_modules_the_docs_run_exist():
    wrong = [f"{doc.relative_to(ROOT)}: python -m {module}"
             for doc, module in mentions(r"-m\s+((?:hvd_mnist|tools)(?:\.\w+)+)")
             if not ((ROOT / (module.replace(".", "/") + ".py")).exists()
                     or (ROOT / module.replace(".", "/") / "__main__.py").exists())]
    assert not wrong, "no such module:\n" + "\n".join(wrong)


def test_readme_is_a_front_page():
    lines = text_of(ROOT / "README.md").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    text = "\n".join(lines)
    assert "hvd_mnist/training/step.py" in text and "hvd_mnist/training/loop.py" in text


# ---------------------------------------------------------------- commits, patches, results

# A commit as the docs and reports cite one: 7 to 40 hex digits with a letter and a digit,
# not part of a longer word, a version (`+hvdmnist.8afa0868`) or a path.
COMMIT = re.compile(r"(?<![\w.+/-])([0-9a-f]{7,40})(?![\w.-])")
REPORTS = sorted((ROOT / "reports").glob("*.md"))


def is_shallow() -> bool:
    out = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                         capture_output=True, text=True)
    return out.returncode != 0 or out.stdout.strip() != "false"


def test_commits_the_docs_and_reports_cite_exist():
    if is_shallow():
        pytest.skip("a shallow clone lacks the history the docs cite")
    cited = {(doc.relative_to(ROOT), name) for doc in DOCS + REPORTS
             for name in COMMIT.findall(text_of(doc))
             if re.search("[a-f]", name) and re.search("[0-9]", name)}
    assert len(cited) > 10
    wrong = [f"{doc}: {name}" for doc, name in sorted(cited)
             if subprocess.run(["git", "cat-file", "-e", f"{name}^{{commit}}"], cwd=ROOT,
                               capture_output=True).returncode != 0]
    assert not wrong, "no such commit:\n" + "\n".join(wrong)


def test_every_horovod_patch_has_its_entries_and_every_patch_named_exists():
    patches = {path.name for path in (ROOT / "tools" / "horovod-patches").glob("*.patch")}
    assert patches
    build_notes = sections(text_of(ROOT / "BUILD_NOTES.md"))
    entries = set(re.findall(r"\*\*`([\w.-]+\.patch)`\*\*", build_notes["The patches"]))
    table = set(re.findall(r"^\| `([\w.-]+\.patch)` \|", text_of(ROOT / "docs" / "horovod.md"),
                           flags=re.M))
    assert not patches - entries, f"BUILD_NOTES.md, The patches, lacks {sorted(patches - entries)}"
    assert not patches - table, f"docs/horovod.md's table lacks {sorted(patches - table)}"
    named = {(doc.relative_to(ROOT), name) for doc in DOCS
             for name in re.findall(r"([\w-]+\.patch)\b", text_of(doc))}
    wrong = [f"{doc}: {name}" for doc, name in sorted(named) if name not in patches]
    assert not wrong, "no such patch in tools/horovod-patches/:\n" + "\n".join(wrong)


def test_every_results_row_names_its_report():
    results = sections(text_of(ROOT / "README.md"))["Results"]
    rows = [row for row in re.findall(r"^\|(.+)\|$", results, flags=re.M)
            if not re.fullmatch(r"[-| ]+", row) and not row.strip().startswith("commit")]
    assert rows, "README.md's Results has no table rows"
    wrong = [row for row in rows if not re.search(r"\]\((?:\.\./)?reports/[\w.-]+\.(?:md|json)", row)]
    assert not wrong, "a results row without its report:\n" + "\n".join(wrong)
