"""LLM-as-judge: robust answer parsing, rubric scores, position-debiased pairwise verdicts, caching.

The judges here are deterministic Backend subclasses that read the judge prompt, so every count is exact."""

from __future__ import annotations

import json
import re

import pytest

from dragon_dagster.engine.evaluate.judge import Judge, PairwiseResult, Score, combine, score_summary
from dragon_dagster.engine.evaluate.judge_answers import parse_json_answer, parse_score, parse_winner
from dragon_dagster.engine.infer.backend import Backend


def between(tag: str, text: str) -> str:
    return re.search(rf"<{tag}>\n(.*?)\n</{tag}>", text, flags=re.S).group(1)


class FakeJudge(Backend):
    """Answers each judge prompt with answer(user_message); counts calls and conversations."""

    def __init__(self, answer, name="fake"):
        self.answer, self.name = answer, name
        self.calls, self.conversations, self.seen = 0, 0, []

    @property
    def identity(self) -> str:
        return f"fake:{self.name}"

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p):
        self.calls += 1
        self.conversations += len(conversations)
        assert temperature == 0.0 and conversations[0][0]["role"] == "system"
        self.seen += [c[-1]["content"] for c in conversations]
        return [self.answer(c[-1]["content"]) for c in conversations]


def first_position(message: str) -> str:
    return '{"winner": "1", "reason": "the first one"}'


def longer(message: str) -> str:
    one, two = between("response_1", message), between("response_2", message)
    winner = "tie" if len(one) == len(two) else ("1" if len(one) > len(two) else "2")
    return f'Comparing both.\n```json\n{{"winner": "{winner}", "reason": "longer is better"}}\n```\nDone.'


def never_json(message: str) -> str:
    return "I think the first one is better, score 8."


# ------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"score": 7, "reason": "ok"}', {"score": 7, "reason": "ok"}),
        ('```json\n{"score": 7}\n```', {"score": 7}),
        ('Here is my verdict:\n```\n{"score": 3}\n```\nHope that helps!', {"score": 3}),
        (
            'Sure. {"score": 9, "reason": "uses {braces} and \\"quotes\\""} -- trailing words',
            {"score": 9, "reason": 'uses {braces} and "quotes"'},
        ),
        ('The reply {is good}. Final: {"score": 5}', {"score": 5}),
        ("{'score': 6, 'reason': 'python style'}", {"score": 6, "reason": "python style"}),
        ('{"score": 2} and later {"score": 9}', {"score": 2}),
        ('{"outer": {"score": 4}}', {"outer": {"score": 4}}),
    ],
)
def test_parse_json_answer_finds_the_object(text, expected):
    assert parse_json_answer(text) == expected


@pytest.mark.parametrize("text", ["", "no json here", "score: 8/10", "[1, 2]", '{"score": 7', None, 7])
def test_parse_json_answer_gives_none(text):
    assert parse_json_answer(text) is None


@pytest.mark.parametrize(
    "text, score",
    [
        ('{"score": 7}', 7.0),
        ('{"score": "7"}', 7.0),
        ('{"Score": "8/10"}', 8.0),
        ('{"rating": 8.5}', 8.5),
        ('{"score": " 10 out of 10 "}', 10.0),
        ('{"score": 0}', None),
        ('{"score": 11}', None),
        ('{"score": "high"}', None),
        ('{"score": true}', None),
        ('{"reason": "no score"}', None),
        ('{"score": NaN}', None),
        ("no json", None),
    ],
)
def test_parse_score(text, score):
    assert parse_score(text)[0] == score


@pytest.mark.parametrize(
    "text, winner",
    [
        ('{"winner": "1"}', "1"),
        ('{"winner": 2}', "2"),
        ('{"winner": "Response 1"}', "1"),
        ('{"winner": "B"}', "2"),
        ('{"winner": "TIE"}', "tie"),
        ('{"better": "second"}', "2"),
        ('{"winner": "both are bad"}', None),
        ('{"reason": "no winner"}', None),
        ("1", None),
    ],
)
def test_parse_winner(text, winner):
    assert parse_winner(text)[0] == winner


def test_combine_orders():
    assert combine("a", "a") == "a" and combine("b", "b") == "b" and combine("tie", "tie") == "tie"
    assert combine("a", "b") == "tie" and combine("a", "tie") == "tie"
    assert combine(None, "a") == "unparsed" and combine("a", None) == "unparsed"


# ------------------------------------------------------------------------------------------ rubric mode

MESSY = {
    "r1": 'Sure!\n```json\n{"score": 7, "reason": "good"}\n```',
    "r2": 'My rating: {"score": "9", "reason": "great"} Thanks for asking.',
    "r3": "This reply deserves an 8.",
    "r4": "{'score': 6, 'reason': 'fine'}",
    "r5": '{"score": 0, "reason": "out of range"}',
}


def test_score_parses_messy_answers_and_never_scores_unparsed_as_zero():
    backend = FakeJudge(lambda m: MESSY[between("assistant_reply", m)])
    scores = Judge(backend).score(["p"] * 5, list(MESSY))
    assert [s.score for s in scores] == [7.0, 9.0, None, 6.0, None]
    assert scores[0].reason == "good" and scores[2].raw == MESSY["r3"] and not scores[2].parsed
    summary = score_summary(scores)
    assert summary == {"n": 5, "scored": 3, "unparsed": 2, "mean": pytest.approx(22 / 3)}
    assert backend.calls == 1 and backend.conversations == 5  # one batched backend call


def test_score_prompt_has_rubric_prompt_reply_and_reference_when_given():
    backend = FakeJudge(lambda m: '{"score": 5}')
    judge = Judge(backend, rubric="Reward replies under 20 words.")
    judge.score(
        ["How do I reset it?", [{"role": "user", "content": "Hi there"}]],
        ["Hold the button.", "Hello"],
        references=["Hold reset for 10 s.", ""],
    )
    with_ref, without_ref = backend.seen
    assert "Reward replies under 20 words." in with_ref
    assert between("user_request", with_ref) == "How do I reset it?"
    assert between("assistant_reply", with_ref) == "Hold the button."
    assert between("reference_answer", with_ref) == "Hold reset for 10 s." and "ground truth" in with_ref
    assert "<reference_answer>" not in without_ref and "user: Hi there" in without_ref
    with pytest.raises(ValueError, match="replies has 1 items but there are 2 prompts"):
        judge.score(["a", "b"], ["x"])


def test_score_when_nothing_parses():
    scores = Judge(FakeJudge(never_json)).score(["p1", "p2"], ["a", "b"])
    assert all(isinstance(s, Score) and s.score is None for s in scores)
    assert score_summary(scores) == {"n": 2, "scored": 0, "unparsed": 2, "mean": None}


# ------------------------------------------------------------------------------------------ pairwise mode


def test_pairwise_asks_twice_with_the_replies_swapped():
    backend = FakeJudge(first_position)
    Judge(backend).compare(["q"], ["reply A"], ["reply B"], references=["ref"])
    a_first, b_first = backend.seen
    assert (between("response_1", a_first), between("response_2", a_first)) == ("reply A", "reply B")
    assert (between("response_1", b_first), between("response_2", b_first)) == ("reply B", "reply A")
    assert between("reference_answer", a_first) == "ref" == between("reference_answer", b_first)


def test_first_position_bias_comes_out_as_all_ties():
    result = Judge(FakeJudge(first_position)).compare(
        ["q1", "q2", "q3"], ["short", "a much longer reply", "x"], ["a much longer reply", "short", "y"]
    )
    assert isinstance(result, PairwiseResult)
    assert result.verdicts == ["tie", "tie", "tie"]
    assert (result.wins, result.ties, result.losses, result.unparsed) == (0, 3, 0, 0)
    assert result.disagreements == 3 and result.win_rate == 0.5
    assert [(r.a_first, r.b_first) for r in result.rows] == [("a", "b")] * 3


def test_length_preferring_judge_gives_wins_and_losses():
    replies_a = ["a long and detailed reply", "also quite long here", "tiny", "same", "longer still here"]
    replies_b = ["short", "brief", "a much longer reply from B", "same", "nope"]
    result = Judge(FakeJudge(longer)).compare([f"q{i}" for i in range(5)], replies_a, replies_b)
    assert result.verdicts == ["a", "a", "b", "tie", "a"]
    assert result.summary() == {
        "n": 5,
        "wins": 3,
        "ties": 1,
        "losses": 1,
        "unparsed": 0,
        "disagreements": 0,
        "win_rate": pytest.approx(0.7),
    }
    assert result.rows[0].reason_a_first == "longer is better"
    assert json.loads(json.dumps(result.to_dict()))["summary"]["wins"] == 3


def test_judge_that_never_returns_json_is_all_unparsed():
    result = Judge(FakeJudge(never_json)).compare(["q1", "q2"], ["a1", "a2"], ["b1", "b2"])
    assert result.verdicts == ["unparsed", "unparsed"]
    assert result.summary() == {
        "n": 2,
        "wins": 0,
        "ties": 0,
        "losses": 0,
        "unparsed": 2,
        "disagreements": 0,
        "win_rate": None,
    }
    assert result.rows[0].raw_a_first == never_json("")


def test_one_unparsed_order_makes_the_row_unparsed():
    def answer(message):  # parses only when A ("good") is shown first
        return '{"winner": "1"}' if between("response_1", message) == "good" else "hmm"

    result = Judge(FakeJudge(answer)).compare(["q"], ["good"], ["bad"])
    assert result.verdicts == ["unparsed"] and result.rows[0].a_first == "a" and result.rows[0].b_first is None
    assert result.parsed == 0 and result.win_rate is None and result.disagreements == 0


# ------------------------------------------------------------------------------------------ caching


def test_cache_in_memory_and_on_disk(tmp_path):
    path = tmp_path / "cache" / "judge.sqlite"
    backend = FakeJudge(longer)
    judge = Judge(backend, cache_path=path)
    args = (["q1", "q2"], ["long reply", "x"], ["short", "longer"])
    first = judge.compare(*args)
    assert backend.conversations == 4 and path.exists()
    assert judge.compare(*args).verdicts == first.verdicts == ["a", "b"]
    assert backend.calls == 1 and backend.conversations == 4  # nothing asked again
    assert judge.stats == {"requests": 4, "cache_hits": 4}

    scorer = FakeJudge(lambda m: '{"score": 6}')
    Judge(scorer, cache_path=path).score(["q1"], ["r1"])
    assert scorer.conversations == 1

    fresh_backend = FakeJudge(longer)  # same identity, new process-like instance: answers come from the file
    fresh = Judge(fresh_backend, cache_path=path)
    assert fresh.compare(*args).summary() == first.summary()
    assert fresh_scores(path) == [6.0]
    assert fresh_backend.calls == 0

    other_rubric = FakeJudge(longer)
    Judge(other_rubric, rubric="Prefer polite replies.", cache_path=path).compare(*args)
    assert other_rubric.conversations == 4  # the rubric is part of the key
    other_judge = FakeJudge(longer, name="other-model")
    Judge(other_judge, cache_path=path).compare(*args)
    assert other_judge.conversations == 4  # so is the backend identity


def fresh_scores(path):
    backend = FakeJudge(lambda m: pytest.fail("should come from the cache"))
    return [s.score for s in Judge(backend, cache_path=path).score(["q1"], ["r1"])]


def test_in_memory_cache_without_a_path_and_duplicates_asked_once():
    backend = FakeJudge(lambda m: '{"score": 4}')
    judge = Judge(backend)
    assert [s.score for s in judge.score(["q", "q", "q2"], ["r", "r", "r"])] == [4.0, 4.0, 4.0]
    assert backend.conversations == 2  # the duplicate row is asked once
    judge.score(["q"], ["r"])
    assert backend.conversations == 2
