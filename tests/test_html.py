"""HTML pages: the title and main text with their headings; boilerplate dropped; empty pages refused."""

import json

import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines.build.chunk import split_sections
from sourcegate.pipelines.build.html import NoText, decode_html, parse_html
from sourcegate.pipelines.build.ingest import ingest

PAGE = """<!doctype html><html><head><title>Refunds | Help Centre</title>
<style>body { color: STYLE }</style><script>track("SCRIPT")</script></head>
<body><header><a href="/">Site HEADER</a><nav>NAV one</nav></header>
<div role="navigation">BREADCRUMB</div><div hidden>HIDDEN</div><span aria-hidden="true">ICON</span>
<main><h1>Refunds</h1><p>Refunds take <em>five</em> working days.</p>
<h2>Lost cards</h2><p>A registered card's balance moves to a new card.</p>
<h3>Stolen cards</h3><p>Report a stolen card within a day.</p>
<aside>ASIDE related</aside><form>FORM <input value="INPUT"><button>BUTTON</button></form>
<iframe src="ad.html">IFRAME</iframe><svg><text>SVG</text></svg><!-- COMMENT -->
<h2>Questions</h2><p># 3 is the usual number of days.</p></main>
<footer>FOOTER © 2026</footer><noscript>NOSCRIPT</noscript></body></html>"""
BOILERPLATE = ["STYLE", "SCRIPT", "HEADER", "NAV", "BREADCRUMB", "HIDDEN", "ICON", "ASIDE", "FORM", "INPUT"]
BOILERPLATE += ["BUTTON", "IFRAME", "SVG", "COMMENT", "FOOTER", "NOSCRIPT"]


def test_main_text_keeps_its_headings_as_sections_and_drops_the_boilerplate():
    title, source, body = parse_html(PAGE)
    assert (title, source) == ("Refunds", "heading")
    assert split_sections(body, "markdown") == [
        ("", "Refunds take five working days."),
        ("Lost cards", "A registered card's balance moves to a new card."),
        ("Stolen cards", "Report a stolen card within a day."),
        ("Questions", "\\# 3 is the usual number of days."),  # a '#' paragraph is text, not a heading
    ]
    assert not [word for word in BOILERPLATE if word in body]


def test_a_paragraph_that_looks_like_a_code_fence_hides_no_heading():
    _, _, body = parse_html("<main><h1>Setup</h1><p>```python</p><h2>Next</h2><p>~~~ and more</p><h2>Last</h2><p>x</p>")
    assert [h for h, _ in split_sections(body, "markdown")] == ["", "Next", "Last"]


def test_an_articles_own_header_is_kept_the_pages_is_not():
    title, _, body = parse_html(
        "<body><header><h1>Transit site</h1></header><article><header><h1>Bikes</h1><p>By the desk</p></header>"
        "<p>Two bikes per rack.</p><footer>Filed under bikes</footer></article><footer>Site footer</footer></body>"
    )
    assert title == "Bikes" and body == "By the desk\n\nTwo bikes per rack.\n\nFiled under bikes"


def test_the_title_element_is_the_title_when_the_page_has_no_h1_and_a_later_h1_is_a_section():
    title, source, body = parse_html(
        "<title> Night  fares </title><p>Lead.</p><h1>First</h1><p>One.</p><h1>Second</h1><p>Two.</p>"
    )
    assert (title, source) == ("First", "heading")
    assert body == "Lead.\n\nOne.\n\n## Second\n\nTwo."
    assert parse_html("<title> Night  fares </title><p>Day fare.</p>")[:2] == ("Night fares", "html_title")
    assert parse_html("<p>Only text.</p>")[:2] == ("", "")


def test_malformed_html_is_read_as_far_as_the_parser_recovers_it():
    _, _, body = parse_html("<div><p>Unclosed <b>bold<p>Next paragraph</div></span><h2>Late<p>After</td>")
    assert split_sections(body, "markdown") == [("", "Unclosed bold\n\nNext paragraph"), ("Late", "After")]


def test_lists_and_tables_keep_their_items_and_rows_apart():
    _, _, body = parse_html("<ul><li>One</li><li></li><li>Two</li></ul><table><tr><th>Ride<th>Fare<tr><td>Bus<td>$2")
    assert body == "- One\n\n- Two\n\nRide | Fare\n\nBus | $2"


@pytest.mark.parametrize(
    "page",
    ["", "   \n", "<html><head><title></title></head><body></body></html>", "<nav>Home</nav><script>x()</script>"],
)
def test_a_page_without_text_is_refused(page):
    with pytest.raises(NoText, match="no text"):
        parse_html(page)


def test_a_declared_charset_is_honoured_when_the_bytes_are_not_utf8():
    page = '<meta charset="iso-8859-1"><title>Caf\xe9</title><p>Cr\xe8me.</p>'.encode("latin-1")
    assert parse_html(decode_html(page))[0] == "Café"
    with pytest.raises(UnicodeDecodeError):
        decode_html("<p>Cr\xe8me.</p>".encode("latin-1"))  # no declaration: not guessed
    xhtml = '<?xml version="1.0" encoding="iso-8859-1"?><html><body><p>Caf\xe9</p></body></html>'
    assert parse_html(decode_html(xhtml.encode("utf-8")))[2] == "Café"  # bytes were UTF-8 whatever it says


def test_html_files_in_a_corpus_are_read_beside_markdown_and_bad_ones_quarantined(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "refunds.html").write_text(PAGE)
    (corpus / "legacy.HTM").write_bytes(b"<title>Legacy</title><p>Old page.</p>")
    (corpus / "menu only.html").write_text("<nav><a href='/'>Home</a></nav>")
    (corpus / "title only.html").write_text("<title>Nothing here</title><nav>Home</nav>")
    (corpus / "latin1.html").write_bytes(b"<p>Cr\xe8me</p>")
    (corpus / "binary.html").write_bytes(b"<p>\x00\x01</p>")
    (corpus / "fares.md").write_text("# Fares\n\nTwo dollars.\n")
    result = ingest(corpus, tmp_path / "out")
    docs = {d["doc_id"]: d for d in pq.read_table(result.documents).to_pylist()}
    assert {k: (d["title"], d["title_source"], d["format"]) for k, d in docs.items()} == {
        "fares": ("Fares", "heading", "markdown"),
        "legacy": ("Legacy", "html_title", "markdown"),
        "refunds": ("Refunds", "heading", "markdown"),
    }
    reasons = {q["source"]: q["reason"] for q in map(json.loads, result.quarantine.read_text().splitlines())}
    assert reasons == {
        "binary.html": "binary file: contains NUL bytes",
        "latin1.html": "invalid UTF-8: byte 5 (and no other charset declared)",
        "menu only.html": "no text: the HTML has no text outside navigation, scripts, styles and forms",
        "title only.html": "empty body",
    }


def test_html5_elements_before_the_body_are_still_read():
    # libxml2 files an HTML 5 element met before <body> under <head>; the text must not be lost with it.
    assert parse_html("<title>T</title><section><p>Alpha</p></section><p>Beta</p>") == (
        "T",
        "html_title",
        "Alpha\n\nBeta",
    )
