"""The evaluation report's Markdown: what it says when a figure does not exist."""

from dragon_dagster.engine.stages.evaluate.markdown import markdown


def report(**judged) -> dict:
    figures = {"eval_loss": 1.0, "perplexity": 2.7, "metrics": {}}
    return {
        "rows": 8,
        "held_out": True,
        "merged_not_worse": True,
        "base": figures,
        "merged": figures,
        "samples": [],
        "judge": {"judge": "the base model (offline)", **judged},
    }


def verdicts(wins=0, ties=0, losses=0, unparsed=0, win_rate=None) -> dict:
    return {
        "wins": wins,
        "ties": ties,
        "losses": losses,
        "unparsed": unparsed,
        "disagreements": 0,
        "win_rate": win_rate,
    }


def test_a_judge_that_gave_no_verdict_is_said_plainly_with_no_win_rate():
    text = markdown(report(vs_base=verdicts(unparsed=4)))
    assert "| base | 0 | 0 | 0 | 4 | 0 | no verdicts |" in text and "None" not in text
    assert "gave no verdict it could read against base" in text and "`judge:`" in text and "`n_judge: 0`" in text


def test_a_judge_with_verdicts_shows_its_win_rate():
    text = markdown(report(vs_base=verdicts(wins=3, losses=1, win_rate=0.75), vs_first_stage=verdicts(unparsed=2)))
    assert "| base | 3 | 0 | 1 | 0 | 0 | 0.7500 |" in text
    assert "no verdict it could read against first_stage:" in text and "against base" not in text
