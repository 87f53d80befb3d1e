"""The BM25 analyser (sourcegate/pipelines/search/analyzer.py): stopwords, stemming, Unicode, and its OpenSearch twin."""

import unicodedata

from sourcegate.pipelines.search.analyzer import STOPWORDS, analyze, nfkc_mappings, opensearch_analysis, words


def test_stopwords_are_dropped_before_stemming():
    assert analyze("What does the refund cost for a bus pass?") == ["refund", "cost", "bus", "pass"]
    assert analyze("the of and what") == []
    assert {"the", "what", "does", "how", "which"} <= STOPWORDS


def test_snowball_english_stems_inflections_together():
    assert analyze("running runs") == ["run", "run"]
    assert analyze("studies studying studied") == ["studi", "studi", "studi"]
    assert analyze("vitamins Vitamin") == ["vitamin", "vitamin"]
    assert analyze("generously") == ["generous"]


def test_unicode_is_nfkc_normalised_and_lowercased():
    # ligature, full-width letters, superscript digit, a precomposed and a decomposed accent
    assert analyze("\ufb01nal Ｒｅｆｕｎｄ x² Cafe\u0301 CAFÉ") == ["final", "refund", "x2", "café", "café"]
    assert words("Ｆｕｌｌ-width ＦＡＱ") == ["full", "width", "faq"]
    assert words("\u00bd") == ["1", "2"]  # ½ is "1⁄2": two numbers, as the OpenSearch mapping makes it


def test_tokens_split_on_non_word_characters_only():
    assert words("e-mail foo_bar 3.5mg don't") == ["e", "mail", "foo_bar", "3", "5mg", "don", "t"]


def test_opensearch_analysis_is_built_from_the_same_pieces():
    a = opensearch_analysis()
    custom = a["analyzer"]["sourcegate_en"]
    assert custom["filter"] == ["lowercase", "sourcegate_stop", "sourcegate_stem"]
    assert a["filter"]["sourcegate_stop"]["stopwords"] == sorted(STOPWORDS)
    assert a["filter"]["sourcegate_stem"] == {"type": "snowball", "language": "English"}
    rules = dict(r.split("=>") for r in nfkc_mappings())
    assert rules["\\ufb01"] == "\\u0066\\u0069"  # ﬁ => fi
    for key, value in list(rules.items())[:200]:
        decode = "".join(chr(int(u, 16)) for u in key.split("\\u")[1:])
        assert value == "".join(f"\\u{ord(c):04x}" for c in unicodedata.normalize("NFKC", decode))
