"""Rewrite Sphinx markup in Python sources to the Markdown that mkdocstrings renders.

The API page (docs/api.md) renders docstrings with mkdocstrings as Markdown: Sphinx roles
(``:func:`x```, ``:class:`x```, ``:math:`x```, ...) and the ``.. math::`` directive would
appear literally. This rewrites, in place:

- ``:func:`name```, ``:class:``, ``:meth:``, ``:attr:``, ``:data:``, ``:mod:``, ``:obj:``,
  ``:exc:`` (also ``:py:func:`` etc.) -> ```name``` (a code span; ``~a.b.c`` -> ```c```);
- ``:math:`tex``` -> ``$tex$`` (inline math, typeset by pymdownx.arithmatex + MathJax);
- a ``.. math::`` directive and its indented body -> a ``$$ ... $$`` block (wrapped in
  ``aligned`` when it aligns at ``&``).

Usage: ``python dev/fix_docstring_roles.py FILE.py [FILE.py ...]`` (prints what changed).
``tests/docs/test_docstrings.py`` checks that no such markup is left in the package.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: A Sphinx cross-reference role followed by its target.
XREF_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|mod|obj|exc):`([~!]?)([^`]+)`")
#: An inline math role.
MATH_ROLE = re.compile(r":math:`([^`]+)`")
#: The math directive (rendered literally by mkdocstrings).
MATH_DIRECTIVE = re.compile(r"^(\s*)\.\. math::[ \t]*(.*)$")


def _xref(m: re.Match) -> str:
    prefix, target = m.group(1), m.group(2).strip()
    if prefix == "~":
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _math_blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = MATH_DIRECTIVE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, first = m.group(1), m.group(2).strip()
        body = [first] if first else []
        i += 1
        # the body: following lines indented deeper than the directive (blank lines inside
        # a body that started on the next line are kept until a dedent)
        while i < len(lines):
            line = lines[i]
            if line.strip() == "":
                if body and i + 1 < len(lines) and _deeper(lines[i + 1], indent):
                    body.append("")
                    i += 1
                    continue
                break
            if not _deeper(line, indent):
                break
            body.append(line.strip())
            i += 1
        if any("&" in b for b in body):  # Sphinx aligns at & by itself; MathJax needs aligned
            body = ["\\begin{aligned}", *body, "\\end{aligned}"]
        out.append(f"{indent}$$")
        out.extend(f"{indent}{b}" if b else "" for b in body)
        out.append(f"{indent}$$")
    return out


def _deeper(line: str, indent: str) -> bool:
    return line.strip() != "" and len(line) - len(line.lstrip()) > len(indent)


def fix_text(text: str) -> str:
    """The source ``text`` with Sphinx roles and math directives rewritten to Markdown.

    Parameters
    ----------
    text : str
        Python source.

    Returns
    -------
    str
        The rewritten source (unchanged when there is nothing to rewrite).
    """
    text = XREF_ROLE.sub(_xref, text)
    text = MATH_ROLE.sub(lambda m: f"${m.group(1)}$", text)
    keep_end = text.endswith("\n")
    lines = _math_blocks(text.split("\n"))
    out = "\n".join(lines)
    return out if keep_end or not out.endswith("\n") else out


def main(argv: list[str] | None = None) -> int:
    """Rewrite the files named in ``argv`` in place; print the ones that changed."""
    for name in argv if argv is not None else sys.argv[1:]:
        p = Path(name)
        old = p.read_text(encoding="utf-8")
        new = fix_text(old)
        if new != old:
            p.write_text(new, encoding="utf-8")
            print(f"rewrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
