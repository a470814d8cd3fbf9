"""HTML: the page's content without its boilerplate (selectolax, nothing fetched).

Navigation, headers, footers, sidebars, forms, scripts and styles are removed; when the page marks its content
(``<main>``, or a single ``<article>``), only that is kept. Block elements end a line; blank lines are dropped,
so the text does not depend on how the source was indented.
"""
from __future__ import annotations

import re

from streams.rag.parsing.extract import Extracted
from streams.rag.parsing.text import decode_text

BOILERPLATE = ("nav", "header", "footer", "aside", "form", "script", "style", "noscript", "template", "svg",
               "iframe", "button", "[role=navigation]", "[role=banner]", "[role=contentinfo]", "[aria-hidden=true]")
BLOCKS = ("p", "div", "section", "article", "li", "h1", "h2", "h3", "h4", "h5", "h6", "br", "tr", "pre",
          "blockquote", "dt", "dd", "table", "ul", "ol", "hr", "title")
_SPACES = re.compile(r"[ \t\f\v\u00a0]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")  # after stripping each line: two or more line ends in a row


def extract_html(data: bytes) -> Extracted:
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(decode_text(data, "HTML"))
    for selector in BOILERPLATE:
        # One at a time, queried again after each removal: a match nested in a removed one is gone with it
        # (decomposing it again would touch freed memory).
        while (node := tree.css_first(selector)) is not None:
            node.decompose()
    for node in tree.css(", ".join(BLOCKS)):
        node.insert_after("\n")
    articles = tree.css("article")
    root = tree.css_first("main") or (articles[0] if len(articles) == 1 else None) or tree.body or tree.root
    raw = root.text() if root is not None else ""
    lines = (_SPACES.sub(" ", line).strip() for line in raw.split("\n"))
    return Extracted(_BLANK_LINES.sub("\n", "\n".join(lines)).strip())
