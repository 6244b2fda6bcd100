"""Verifiable rewards: every type and its edge cases, validation, error policy, spec round trip, TRL adapter."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from dragon_dagster.engine.commands import run_command
from dragon_dagster.engine.rewards import RewardError, RewardSet, RewardSpec, parse_reward, score_rows, trl_reward_funcs

PY = sys.executable


def score(spec: dict, completion: str, reference=None, prompt: str = "", row: dict | None = None) -> float:
    return parse_reward(spec).score(completion, reference, prompt, row)


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


# -- reference rewards --------------------------------------------------------------------------------------


def test_exact_is_normalized():
    assert score({"type": "exact"}, "  Lima. ", "lima") == 1.0
    assert score({"type": "exact"}, "Lima, Peru", "Lima") == 0.0


def test_contains():
    assert score({"type": "contains"}, "The capital is LIMA, I think", "Lima") == 1.0
    assert score({"type": "contains"}, "Cusco", "Lima") == 0.0


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        ("so the answer is 1/2", "0.5", 1.0),
        ("total: 1,000", "1000", 1.0),
        ("first 7 then 12", "12", 1.0),
        ("12 then 7", "12", 0.0),
        ("no number at all", "3", 0.0),
        ("-4", "-4.0", 1.0),
    ],
)
def test_numeric_compares_the_last_number_exactly(completion, reference, expected):
    assert score({"type": "numeric"}, completion, reference) == expected


@pytest.mark.parametrize("kind", ["exact", "contains", "numeric"])
@pytest.mark.parametrize("reference", [None, "", "   ", float("nan")])
def test_reference_rewards_refuse_a_row_without_reference(kind, reference):
    with pytest.raises(RewardError, match=rf"'{kind}'.*no reference"):
        score({"type": kind}, "42", reference)


# -- format rewards -----------------------------------------------------------------------------------------


def test_regex_case_sensitivity():
    assert score({"type": "regex", "pattern": r"^T-\d{4}"}, "t-1234 fixed") == 1.0
    assert score({"type": "regex", "pattern": r"^T-\d{4}", "case_sensitive": True}, "t-1234 fixed") == 0.0
    assert score({"type": "regex", "pattern": r"^T-\d{4}", "case_sensitive": True}, "T-1234 fixed") == 1.0
    assert score({"type": "regex", "pattern": r"^T-\d{4}"}, "ticket T-1234") == 0.0


def test_json_validity_fences_and_partial_credit():
    keys = {"type": "json", "keys": ["id", "status", "owner"]}
    assert score({"type": "json"}, '{"a": 1}') == 1.0
    assert score({"type": "json"}, "[1, 2]") == 1.0
    assert score({"type": "json"}, "{'a': 1}") == 0.0
    assert score({"type": "json"}, "") == 0.0
    assert score({"type": "json"}, 'Sure:\n```json\n{"id": 3}\n```\nDone.') == 1.0
    assert score(keys, '```\n{"id": 1, "status": "open"}\n```') == pytest.approx(2 / 3)
    assert score(keys, '{"id": 1, "status": "open", "owner": null}') == 1.0
    assert score(keys, '["id", "status", "owner"]') == 0.0  # valid JSON but not an object: no key credit
    assert score(keys, "[" * 100_000) == 0.0  # absurd nesting is invalid, not a crash


def test_length_is_one_inside_the_bounds_and_falls_linearly_beyond():
    both = {"type": "length", "min_chars": 10, "max_chars": 20}
    assert score(both, "x" * 10) == 1.0
    assert score(both, "x" * 20) == 1.0
    assert score(both, "x" * 5) == pytest.approx(0.5)
    assert score(both, "") == 0.0
    assert score(both, "x" * 25) == pytest.approx(0.75)
    assert score(both, "x" * 40) == 0.0
    assert score(both, "x" * 400) == 0.0
    assert score({"type": "length", "max_chars": 4}, "") == 1.0
    assert score({"type": "length", "min_chars": 4}, "x" * 1000) == 1.0


def test_keyword_any_all_whole_words_case_insensitive():
    spec = {"type": "keyword", "words": ["refund", "C++"]}
    assert score(spec, "We will REFUND you.") == 1.0
    assert score(spec, "refunded") == 0.0
    assert score(spec, "I like c++!") == 1.0
    assert score({**spec, "mode": "all"}, "refund in C++") == 1.0
    assert score({**spec, "mode": "all"}, "refund only") == 0.0
    assert score({"type": "keyword", "words": "solo"}, "a solo act") == 1.0  # one word as a plain string


# -- command ------------------------------------------------------------------------------------------------


def test_command_exit_code_from_stdin():
    spec = {"type": "command", "command": [PY, "-c", "import sys; sys.exit(0 if sys.stdin.read() == 'ok' else 3)"]}
    assert score(spec, "ok") == 1.0
    assert score(spec, "not ok") == 0.0


def test_command_stdout_is_rescaled_and_clamped():
    spec = {
        "type": "command",
        "score_from": "stdout",
        "min_score": 0,
        "max_score": 10,
        "command": [PY, "-c", "import sys; print('lint score'); print(sys.stdin.read())"],
    }
    assert score(spec, "7.5") == pytest.approx(0.75)
    assert score(spec, "3/4 then 25") == 1.0
    assert score(spec, "-3") == 0.0
    assert score(spec, "no number") == 0.0
    inverted = {**spec, "min_score": 10, "max_score": 0}  # fewer lint errors is better
    assert score(inverted, "2") == pytest.approx(0.8)


def test_command_runs_pytest_on_the_completion_file(tmp_path):
    spec = {
        "type": "command",
        "input": "file",
        "command": [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "{completion_file}"],
    }
    good = "def add(a, b):\n    return a + b\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    assert score(spec, good) == 1.0
    assert score(spec, good.replace("a + b", "a - b")) == 0.0


def test_command_runs_a_pytest_file_on_the_completion_from_stdin(tmp_path):
    check = write(
        tmp_path / "test_check.py",
        """\
        import sys
        def test_answer():
            assert sys.stdin.read().strip() == "42"
    """,
    )
    # -s: without it pytest swaps stdin for a stub, and the test could not read the completion.
    spec = {"type": "command", "command": [PY, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(check)]}
    assert score(spec, "42\n") == 1.0
    assert score(spec, "41") == 0.0


def test_command_timeout_scores_zero_and_ends_the_process_group(tmp_path):
    # The child would keep stdout open for a minute; killing the group is what lets this return quickly.
    hang = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    reward = parse_reward({"type": "command", "command": [PY, "-c", hang], "timeout": 0.5})
    started = time.monotonic()
    assert reward.score("anything") == 0.0
    assert time.monotonic() - started < 4


def test_command_gets_shell_metacharacters_as_data(tmp_path):
    evil = "$(touch X); rm -rf / ; `echo` && touch X | cat > X 'quote\" {completion_file} \\ \n%s"
    received = tmp_path / "received.txt"
    copy = f"import sys; open({str(received)!r}, 'w', newline='').write(sys.stdin.read())"
    assert parse_reward({"type": "command", "command": [PY, "-c", copy]}).score(evil) == 1.0
    assert received.read_bytes().decode() == evil
    via_file = f"import shutil, sys; shutil.copyfile(sys.argv[1], {str(received)!r})"
    received.unlink()
    by_file = parse_reward({"type": "command", "input": "file", "command": [PY, "-c", via_file, "{completion_file}"]})
    assert by_file.score(evil) == 1.0
    assert received.read_bytes().decode() == evil
    assert not (tmp_path / "X").exists() and not Path("X").exists()


def test_command_survives_huge_and_non_utf8_output():
    huge = parse_reward(
        {
            "type": "command",
            "score_from": "stdout",
            "command": [PY, "-c", "import sys; sys.stdout.write('9 ' * 5_000_000 + '0.25\\n')"],
        }
    )
    assert huge.score("") == pytest.approx(0.25)
    binary = parse_reward(
        {
            "type": "command",
            "score_from": "stdout",
            "command": [PY, "-c", "import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\x80 score 0.5 \\xc3')"],
        }
    )
    assert binary.score("") == pytest.approx(0.5)
    code, out = run_command([PY, "-c", "import sys; sys.stdout.buffer.write(b'\\xff' * 10)"], None, 10)
    assert code == 0 and out == "\ufffd" * 10


def test_command_ignoring_a_large_stdin_does_not_block():
    assert parse_reward({"type": "command", "command": [PY, "-c", "pass"]}).score("x" * 5_000_000) == 1.0


def test_command_that_does_not_exist_is_a_clear_row_error():
    reward = parse_reward({"type": "command", "command": ["definitely-not-a-command-xyz"]})
    with pytest.raises(RewardError, match="cannot run 'definitely-not-a-command-xyz'"):
        reward.score("x")


# -- custom ---------------------------------------------------------------------------------------------------


def test_custom_reward_gets_prompt_completion_reference_and_row(tmp_path):
    path = write(
        tmp_path / "product.py",
        """\
        def reward(prompt, completion, reference, row):
            return 1.0 if row["product"] in completion and prompt.startswith("Ask") and reference == "r" else 0.0
    """,
    )
    rs = RewardSet([{"type": "custom", "file": str(path), "name": "mentions_product"}])
    rows = [
        {
            "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Ask about it"}],
            "reference": "r",
            "product": "Widget",
        }
    ] * 2
    out = rs.score(["The Widget works", "nothing"], rows)
    assert out.scores == {"mentions_product": [1.0, 0.0]}


def test_custom_file_without_the_function_names_the_file(tmp_path):
    path = write(tmp_path / "nofn.py", "def other(*a):\n    return 1\n")
    reward = parse_reward({"type": "custom", "file": str(path)})
    with pytest.raises(RewardError, match=r"nofn\.py does not define a function reward\("):
        reward.load()
    with pytest.raises(RewardError, match=r"nofn\.py"):
        RewardSet([reward]).check_rows([{"prompt": "p"}])
    assert parse_reward({"type": "custom", "file": str(path), "fn": "other"}).score("x") == 1.0


def test_custom_file_that_does_not_load_or_exist(tmp_path):
    broken = write(tmp_path / "broken.py", "def reward(:\n")
    with pytest.raises(RewardError, match=r"loading .*broken\.py failed: SyntaxError"):
        parse_reward({"type": "custom", "file": str(broken)}).load()
    with pytest.raises(RewardError, match="does not exist"):
        parse_reward({"type": "custom", "file": str(tmp_path / "missing.py")})


def test_raising_custom_reward_raise_or_zero(tmp_path):
    path = write(
        tmp_path / "picky.py",
        """\
        def reward(prompt, completion, reference, row):
            if completion == "boom":
                raise KeyError("no such field")
            return 0.5
    """,
    )
    rs = RewardSet([{"type": "custom", "file": str(path), "name": "picky"}, {"type": "length", "max_chars": 100}])
    rows = [{"prompt": "p"}] * 3
    with pytest.raises(RewardError) as info:
        rs.score(["fine", "boom", "fine"], rows)
    message = str(info.value)
    assert "'picky'" in message and str(path) in message and "row 1" in message and "no such field" in message
    out = rs.score(["fine", "boom", "boom"], rows, on_error="zero")
    assert out.scores["picky"] == [0.5, 0.0, 0.0]
    assert out.errors == {"picky": 2, "length": 0}
    assert out.total == [1.5, 1.0, 1.0]


def test_custom_reward_must_return_a_finite_number(tmp_path):
    path = write(tmp_path / "bad.py", "def reward(p, c, r, row):\n    return {'nan': float('nan'), 'str': '1'}[c]\n")
    reward = parse_reward({"type": "custom", "file": str(path)})
    for completion in ("nan", "str"):
        with pytest.raises(RewardError, match="not a finite number"):
            reward.score(completion)


def test_localize_copies_custom_files_into_the_run(tmp_path):
    (tmp_path / "src").mkdir()
    path = write(tmp_path / "src" / "mine.py", "def reward(p, c, r, row):\n    return 0.25\n")
    run = tmp_path / "run"
    local = RewardSet([{"type": "custom", "file": str(path)}, {"type": "exact"}]).localize(run)
    assert (run / "rewards" / "mine.py").read_text() == path.read_text()
    assert local[0].file == "rewards/mine.py"  # relative to the run: it still works once the run directory moves
    assert local[1].to_dict() == {"type": "exact", "weight": 1.0, "name": "exact"}
    path.unlink()  # the run no longer depends on the original file
    moved = run.rename(tmp_path / "moved")
    assert RewardSet(local, base_dir=moved).rewards[0].score("x") == 0.25  # typed, as a job carries them
    from_json = RewardSet.from_list(json.loads(json.dumps([r.to_dict() for r in local])), base_dir=moved)
    assert from_json.rewards[0].score("x") == 0.25
    run = moved
    other = write(tmp_path / "mine.py", "def reward(p, c, r, row):\n    return 1\n")
    with pytest.raises(RewardError, match="already holds a different file"):
        parse_reward({"type": "custom", "file": str(other)}).localize(run)


# -- validation and spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"type": "nope"}, "unknown reward type 'nope'"),
        ({"type": "exact", "weight": -1}, r"'exact'.*weight = -1: Input should be greater than or equal to 0"),
        ({"type": "exact", "weight": "heavy"}, "weight = 'heavy': Input should be a valid number"),
        ({"type": "exact", "weight": True}, "weight: must be a number, not true"),
        ({"type": "exact", "weight": float("inf")}, "weight = inf: Input should be a finite number"),
        ({"type": "exact", "name": ""}, "name: must be a non-empty string"),
        ({"type": "regex"}, r"'regex'.*needs pattern: a Python regular expression"),
        ({"type": "regex", "pattern": "("}, "pattern: '\\(' is not a valid regular expression"),
        ({"type": "regex", "pattern": "x", "case_sensitive": "maybe"}, "case_sensitive = 'maybe': .*valid boolean"),
        ({"type": "length"}, "'length'.*needs min_chars or max_chars"),
        ({"type": "length", "max_chars": 0}, "max_chars = 0: Input should be greater than or equal to 1"),
        ({"type": "length", "min_chars": 2.5}, "min_chars = 2.5: Input should be a valid integer"),
        ({"type": "length", "min_chars": 30, "max_chars": 20}, "above max_chars"),
        ({"type": "keyword"}, "'keyword'.*needs words"),
        ({"type": "keyword", "words": []}, r"words = \[\]: .*at least 1 item"),
        ({"type": "keyword", "words": ["a"], "mode": "some"}, "mode = 'some': Input should be 'any' or 'all'"),
        ({"type": "json", "keys": [1]}, r"keys\[0\] = 1: Input should be a valid string"),
        ({"type": "command"}, "'command'.*needs command"),
        ({"type": "command", "command": []}, "command = .*at least 1 item"),
        ({"type": "command", "command": ["pytest", None]}, r"command\[1\] = None: Input should be a valid string"),
        ({"type": "command", "command": "pytest -q"}, "never run through a shell"),
        ({"type": "command", "command": ["x"], "input": "argv"}, "input = 'argv': Input should be 'stdin' or 'file'"),
        ({"type": "command", "command": ["x"], "input": "file"}, "needs a '{completion_file}' argument"),
        ({"type": "command", "command": ["x"], "score_from": "stderr"}, "score_from = 'stderr': Input should be"),
        ({"type": "command", "command": ["x"], "score_from": "stdout", "max_score": 0}, "must differ"),
        ({"type": "command", "command": ["x"], "timeout": -1}, "timeout = -1: Input should be greater than or equal"),
        ({"type": "custom"}, "'custom'.*needs file"),
        ({"type": "custom", "file": "x.py", "fn": "not a name"}, "fn: must be a Python function name"),
        ({"type": "tool_call", "no_call": 2}, "no_call = 2: Input should be less than or equal to 1"),
        ({"type": "numeric", "max_chars": 20}, "'numeric'.*does not take max_chars; it takes weight, name$"),
        ({"type": "length", "max_chars": 20, "patern": "x"}, "does not take patern; it takes .*min_chars, max_chars"),
    ],
)
def test_validation_errors_name_the_reward_and_problem(spec, message):
    with pytest.raises(RewardError, match=message):
        parse_reward(spec)


def test_pydantic_parses_the_numbers_yaml_gives_as_text():
    # YAML 1.1 (PyYAML) reads 1e-3 as a string; pydantic's number parsing takes it, as it takes "20" for 20
    assert parse_reward({"type": "exact", "weight": "1e-3"}).weight == 0.001
    length = parse_reward({"type": "length", "min_chars": "5", "max_chars": 20.0})
    assert (length.min_chars, length.max_chars) == (5, 20)
    assert parse_reward({"type": "keyword", "words": "cat"}).words == ["cat"]  # a lone word is a list of one


def test_reward_error_is_a_value_error():
    assert issubclass(RewardError, ValueError)


def test_spec_round_trip_and_default_names():
    specs = [
        {"type": "numeric", "weight": 1},
        {"type": "length", "max_chars": 20, "weight": 0.2},
        {"type": "regex", "pattern": "^T-", "name": "ticket", "case_sensitive": True},
    ]
    rs = RewardSet.from_list(specs)
    assert rs.names == ["numeric", "length", "ticket"]
    assert rs.weights() == [1.0, 0.2, 1.0]
    dumped = rs.to_list()
    assert dumped[1] == {"type": "length", "weight": 0.2, "name": "length", "min_chars": None, "max_chars": 20}
    assert RewardSet.from_list(json.loads(json.dumps(dumped))).to_list() == dumped
    assert RewardSet({"type": "exact"}).names == ["exact"]


def test_names_must_be_unique_and_set_not_empty():
    with pytest.raises(RewardError, match="'length' is used twice"):
        RewardSet([{"type": "length", "max_chars": 5}, {"type": "length", "min_chars": 1}])
    RewardSet([{"type": "length", "max_chars": 5}, {"type": "length", "min_chars": 1, "name": "min_len"}])
    with pytest.raises(RewardError, match="at least one reward"):
        RewardSet([])


def test_check_rows_requires_references_before_training():
    rs = RewardSet([{"type": "numeric"}, {"type": "length", "max_chars": 5}])
    rs.check_rows([{"prompt": "1+1?", "reference": "2"}, {"prompt": "2+2?", "reference": 4}])
    with pytest.raises(RewardError, match="'numeric'.*dataset lacks a reference"):
        rs.check_rows([{"prompt": "1+1?"}, {"prompt": "2+2?", "reference": None}])
    with pytest.raises(RewardError, match=r"1 of 2 rows lack one \(rows 1\)"):
        rs.check_rows([{"prompt": "a", "reference": "2"}, {"prompt": "b", "reference": " "}])
    with pytest.raises(RewardError, match=r"needs a number in each reference.*rows 0"):
        rs.check_rows([{"prompt": "a", "reference": "two"}])
    RewardSet([{"type": "length", "max_chars": 5}]).check_rows([{"prompt": "no reference needed"}])


def test_score_totals_and_means():
    rs = RewardSet([{"type": "numeric"}, {"type": "length", "max_chars": 4, "weight": 0.5}])
    rows = [{"prompt": "2+2?", "reference": "4"}, {"prompt": "3+3?", "reference": "6"}]
    out = rs.score(["4", "it is 5"], rows)
    assert out.scores == {"numeric": [1.0, 0.0], "length": [1.0, pytest.approx(0.25)]}
    assert out.total == [1.5, pytest.approx(0.125)]
    assert out.means() == {
        "reward": pytest.approx(0.8125),
        "reward_numeric": 0.5,
        "reward_length": pytest.approx(0.625),
    }
    with pytest.raises(RewardError, match="on_error"):
        rs.score(["4", "6"], rows, on_error="ignore")
    with pytest.raises(RewardError, match="1 completions for 2 rows"):
        rs.score(["4"], rows)


# -- TRL adapter ----------------------------------------------------------------------------------------------


def test_trl_funcs_accept_strings_and_messages_with_columns_as_kwargs(tmp_path):
    path = write(
        tmp_path / "field.py",
        """\
        def reward(prompt, completion, reference, row):
            return float(row["product"] in completion and prompt == "Which product?")
    """,
    )
    rs = RewardSet(
        [
            {"type": "numeric"},
            {"type": "length", "max_chars": 10, "weight": 0.2},
            {"type": "custom", "file": str(path), "name": "product"},
        ]
    )
    funcs = trl_reward_funcs(rs)
    assert [f.__name__ for f in funcs] == ["numeric", "length", "product"]
    assert rs.weights() == [1.0, 0.2, 1.0]
    prompts = [[{"role": "user", "content": "Which product?"}]] * 2
    kwargs = {"reference": ["7", "8"], "product": ["Gizmo", "Gizmo"], "trainer_state": object(), "log_metric": print}
    as_text = ["Gizmo 7", "Gizmo 9 now"]
    as_messages = [[{"role": "assistant", "content": c}] for c in as_text]
    for completions in (as_text, as_messages):
        results = [f(prompts=prompts, completions=completions, completion_ids=[[1], [2]], **kwargs) for f in funcs]
        assert results == [[1.0, 0.0], [1.0, pytest.approx(0.9)], [1.0, 1.0]]
    assert funcs[2](["Which product?"], ["a Gizmo"], product=["Gizmo"]) == [1.0]  # plain-text prompts too


def test_trl_funcs_error_policy(tmp_path):
    path = write(tmp_path / "boom.py", "def reward(p, c, r, row):\n    raise RuntimeError('bad row')\n")
    spec = [{"type": "custom", "file": str(path), "name": "boom"}]
    with pytest.raises(RewardError, match=r"'boom' in .*boom\.py failed on row 0: RuntimeError: bad row"):
        trl_reward_funcs(spec)[0](["p"], ["c"])
    lenient = trl_reward_funcs(spec, on_error="zero")[0]
    assert lenient(["p", "q"], ["c", "d"]) == [0.0, 0.0]
    assert lenient.errors == 2
    with pytest.raises(RewardError, match="'numeric'.*no reference"):
        trl_reward_funcs([{"type": "numeric"}])[0](["p"], ["4"])


def test_score_rows_reads_reference_from_rows():
    reward = parse_reward({"type": "exact"})
    assert score_rows(reward, ["Paris"], [{"prompt": "?", "reference": "paris"}]) == ([1.0], 0)


# -- pydantic models: a reward spec as a field type --------------------------------------------------------------


def test_json_schema_of_reward_specs_lists_each_types_options():
    schema = TypeAdapter(list[RewardSpec]).json_schema()
    length = schema["$defs"]["LengthReward"]
    assert length["additionalProperties"] is False
    assert {"min_chars", "max_chars"} <= set(length["properties"])
    assert "pattern" not in length["properties"]
    assert set(schema["items"]["discriminator"]["mapping"]) == {
        "exact",
        "contains",
        "numeric",
        "regex",
        "json",
        "length",
        "keyword",
        "command",
        "custom",
        "tool_call",
        "reward_model",
    }


def test_a_misspelled_option_is_named_by_pydantic_validation():
    with pytest.raises(ValidationError, match="patern"):
        TypeAdapter(list[RewardSpec]).validate_python([{"type": "length", "max_chars": 5, "patern": "x"}])


def test_a_stage_model_names_the_reward_option_at_fault():
    class Stage(BaseModel):
        rewards: list[RewardSpec]

    with pytest.raises(ValidationError, match=r"rewards\.0\.regex\.pattern\n  Field required"):
        Stage.model_validate({"rewards": [{"type": "regex"}]})
    with pytest.raises(ValidationError, match=r"rewards\.1\.length\n  Value error, needs min_chars or max_chars"):
        Stage.model_validate({"rewards": [{"type": "exact"}, {"type": "length"}]})
    yaml_text = Stage.model_validate({"rewards": [{"type": "exact", "weight": "1e-3"}]})  # YAML 1.1 reads 1e-3 as text
    assert yaml_text.rewards[0].weight == 0.001
    stage = Stage.model_validate({"rewards": [{"type": "length", "max_chars": 5}, {"type": "exact", "weight": 2}]})
    assert [r.to_dict() for r in stage.rewards] == RewardSet.from_list(stage.rewards).to_list()
    assert stage.rewards[0].score("x" * 10) == 0.0 and stage.rewards[1].weight == 2.0


def test_custom_file_is_resolved_only_where_the_base_dir_is_known(tmp_path):
    write(tmp_path / "mine.py", "def reward(p, c, r, row):\n    return 0.5\n")
    specs = [{"type": "custom", "file": "mine.py", "name": "mine"}]
    validated = TypeAdapter(list[RewardSpec]).validate_python(specs)  # no base dir here: kept as written
    assert validated[0].file == "mine.py"
    for given in (specs, validated):
        rs = RewardSet.from_list(given, base_dir=tmp_path)
        assert rs.rewards[0].file == str((tmp_path / "mine.py").resolve())
        assert rs.rewards[0].score("x") == 0.5
    with pytest.raises(RewardError, match="does not exist"):
        RewardSet.from_list(specs, base_dir=tmp_path / "elsewhere")
