"""HTML articles: a page's title and main text, its headings kept as Markdown section headings.

lxml's HTML parser (libxml2) reads the page, malformed markup as far as libxml2 recovers it. Of the
parsed tree, the main content is `<main>` (or role=main), else the page's only `<article>`, else
the whole page; boilerplate is dropped from it by what the markup says an element is, never by guessing
from class names: scripts, styles, navigation, forms, asides, embedded objects, hidden elements and
ARIA landmarks other than the main one, and a `<header>`/`<footer>` that belongs to the page rather
than to an article or section (the HTML spec's banner / contentinfo rule). The body is the text of
the remaining blocks, one paragraph each, with `<h2>`-`<h6>` (and any `<h1>` after the title) as
`##`-`######` lines, so the chunker cuts an HTML page at its headings exactly as a Markdown one.
"""

from __future__ import annotations

import re

import lxml.html
from lxml import etree

HTML_SUFFIXES = {".html", ".htm"}

DROPPED_TAGS = {
    "script", "style", "noscript", "template", "nav", "aside", "form", "button", "select", "textarea",
    "input", "label", "iframe", "object", "embed", "svg", "canvas", "video", "audio", "map", "dialog", "menu",
}  # fmt: skip
DROPPED_ROLES = {"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar", "dialog"}
# A <header>/<footer> inside one of these is that element's own (an article's byline); elsewhere it is the page's.
SECTIONING = {"article", "section", "main", "aside", "nav"}
BLOCK_TAGS = {
    "p", "div", "li", "dt", "dd", "blockquote", "pre", "table", "tr", "figcaption", "caption",
    "address", "section", "article", "main", "header", "footer", "ul", "ol", "dl", "details", "summary",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "br", "body",
}  # fmt: skip
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_SPACE = re.compile(r"\s+")


class NoText(ValueError):
    """An HTML file without text once its boilerplate is dropped, or one libxml2 cannot read at all."""


def decode_html(data: bytes) -> str:
    """The page's text: UTF-8 (a BOM allowed), else the charset its <meta> declares in the first 1024 bytes.

    Raises UnicodeDecodeError (from the UTF-8 attempt) when neither decodes, LookupError for an unknown charset.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        declared = _CHARSET.search(data[:1024])  # the HTML spec's prescan window
        if not declared or declared.group(1).lower() in (b"utf-8", b"utf8"):
            raise
        return data.decode(declared.group(1).decode("ascii"))


def parse_html(text: str) -> tuple[str, str, str]:
    """(title, title source 'heading' | 'html_title' | '', body) of an HTML page's text."""
    try:
        # Bytes with a stated encoding: a page's own <?xml encoding=...?> or <meta charset> cannot contradict it.
        root = lxml.html.document_fromstring(text.encode("utf-8"), parser=_parser())
    except (etree.ParserError, ValueError) as exc:  # an empty or whitespace-only file
        raise NoText(f"no text: the HTML parser read nothing ({exc})") from None
    page_title = " ".join(_text(t) for t in root.iter("title")).strip()
    for element in list(root.iter("title")):  # read; never body text
        _remove(element)
    main = _main_content(root)
    _drop_boilerplate(main)
    h1 = main.find(".//h1")
    heading = _text(h1) if h1 is not None else ""
    if h1 is not None and heading:
        _remove(h1)
    blocks = _blocks(main)
    title, source = (heading, "heading") if heading else (page_title, "html_title" if page_title else "")
    if not blocks and not title:
        raise NoText("no text: the HTML has no text outside navigation, scripts, styles and forms")
    return title, source, "\n\n".join(blocks)


def _parser() -> lxml.html.HTMLParser:
    return lxml.html.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True, no_network=True)


def _main_content(root):
    main = root.find(".//main")
    if main is None:
        found = root.xpath(".//*[@role='main']")
        main = found[0] if found else None
    if main is None:
        articles = root.findall(".//article")
        main = articles[0] if len(articles) == 1 else None
    # Else the whole page: libxml2 knows HTML 4 only and files an HTML 5 element (<section>, <nav>) met
    # before any <body> under <head>, so <body> alone could miss text.
    return main if main is not None else root


def _drop_boilerplate(main) -> None:
    doomed = [el for el in main.iter(etree.Element) if el is not main and _is_boilerplate(el)]
    for el in doomed:
        if el.getparent() is not None:
            _remove(el)


def _is_boilerplate(el) -> bool:
    tag = el.tag if isinstance(el.tag, str) else ""
    if tag in DROPPED_TAGS or (el.get("role") or "").strip().lower() in DROPPED_ROLES:
        return True
    if el.get("hidden") is not None or (el.get("aria-hidden") or "").strip().lower() == "true":
        return True
    if tag in ("header", "footer"):
        return not any(a.tag in SECTIONING for a in el.iterancestors())
    return False


def _remove(el) -> None:
    """Drop `el` and its subtree, keeping the text that follows it (its tail)."""
    parent, tail = el.getparent(), el.tail
    if tail:
        previous = el.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + tail
        else:
            parent.text = (parent.text or "") + tail
    parent.remove(el)


def _blocks(main) -> list[str]:
    """The text of `main` as paragraphs: a new one at every block element, headings as '#' lines."""
    blocks: list[str] = []
    current: list[str] = []

    def flush() -> None:
        text = _SPACE.sub(" ", "".join(current)).strip()
        if re.search(r"\w", text):  # an empty list item's '-' or a lone separator is no paragraph
            blocks.append(_escape_heading_marks(text))
        current.clear()

    def walk(el) -> None:
        tag = el.tag if isinstance(el.tag, str) else ""
        if tag in BLOCK_TAGS:
            flush()
        level = _heading_level(tag)
        if level:
            heading = _text(el)
            if heading:
                blocks.append("#" * level + " " + heading)
        else:
            if tag == "li":
                current.append("- ")
            elif tag in ("td", "th") and "".join(current).strip():  # a table row stays one line
                current.append(" | ")
            current.append(el.text or "")
            for child in el:
                walk(child)
        if tag in BLOCK_TAGS:
            flush()
        current.append(el.tail or "")

    walk(main)
    flush()
    return blocks


def _heading_level(tag: str) -> int:
    """Markdown level of an HTML heading: h1 (one after the title) and h2 are '##', h3 '###', ... h6."""
    return max(2, int(tag[1])) if re.fullmatch(r"h[1-6]", tag) else 0


def _escape_heading_marks(text: str) -> str:
    """A paragraph that happens to start with '#' is text, not a heading the chunker would cut at; one that starts
    with a code fence's ``` or ~~~ opens no code block that would hide the page's next headings from it."""
    return "\\" + text if text.startswith(("#", "```", "~~~")) else text


def _text(el) -> str:
    return _SPACE.sub(" ", el.text_content()).strip()
