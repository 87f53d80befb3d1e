"""The label budget's benchmark: its drawn rows nest and keep the label mix, and a design's figures count right."""

from benchmarks.label_budget import check_figures, draw, fit_figures


def questions(n_answer: int, n_decline: int) -> list[dict]:
    return [{"id": f"a{i}", "label": "answer"} for i in range(n_answer)] + [
        {"id": f"d{i}", "label": "decline"} for i in range(n_decline)
    ]


def test_a_smaller_row_is_inside_the_larger_one_and_both_keep_the_label_mix():
    items = questions(60, 40)
    small, large = draw(items, 10, seed=13), draw(items, 30, seed=13)
    assert {q["id"] for q in small} < {q["id"] for q in large}
    assert [sum(q["label"] == "answer" for q in rows) for rows in (small, large)] == [6, 18]
    assert draw(items, 10, seed=13) == small and draw(items, 10, seed=14) != small


def row(label: str, kind: str | None, score: float) -> dict:
    return {"label": label, "kind": kind, "signals": {"s": score}}


def test_fit_figures_are_at_the_lowest_should_answer_score_and_check_figures_at_the_placed_threshold():
    fit = [row("answer", None, 0.5), row("answer", None, 0.9), row("decline", "off_topic", 0.2)]
    fit += [row("decline", "off_topic", 0.6), row("decline", "near_topic", 0.4)]
    figures = fit_figures(fit, "s")
    assert (
        figures["off_topic_declined_at_full_coverage"] == "1/2"
        and figures["near_topic_declined_at_full_coverage"] == "1/1"
    )
    assert figures["gap_off_topic"] == -0.1 and figures["auc_off_topic"] == 0.75

    check = {"signal": "s", "threshold": 0.5, "questions": fit + [row("answer", None, None) | {"signals": {}}]}
    assert check_figures(check) == {
        "threshold": 0.5,
        "should_answer_kept": "2/3",  # a question the signal did not score is declined, as at runtime
        "near_topic_declined": "1/1",
        "off_topic_declined": "1/2",
    }
