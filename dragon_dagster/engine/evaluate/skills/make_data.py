"""Writes the bundled general-skills suite's data (train.jsonl: the few-shot examples; test.jsonl: the items
scored), deterministically: `python make_data.py` beside it rewrites the same files. Every item is made here from
a seeded generator, so none comes from a pipeline's data or from the hub.

Each skill is a task file beside this one (skills_<name>.yaml); its rows are {"prompt", "choices", "answer"} for a
multiple-choice task (the answer is the index of the right choice) and {"prompt", "target"} for copy, which is
scored on whether the greedy continuation is the target, token for token."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

HERE = Path(__file__).parent
N_TEST, N_TRAIN = 32, 5
WORDS = [
    "apple", "river", "candle", "garden", "pencil", "window", "basket", "silver", "rocket", "meadow", "lantern",
    "pillow", "harbor", "violin", "tiger", "orange", "button", "forest", "marble", "jacket", "copper", "island",
    "turtle", "ladder", "planet", "cotton", "mirror", "bottle", "saddle", "winter",
]  # fmt: skip
NAMES = ["Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Luis"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
]  # fmt: skip


def choice_row(rng: random.Random, prompt: str, right: str, wrong: list[str]) -> dict:
    """A multiple-choice row: the right answer among distinct wrong ones, in a seeded order."""
    choices = [right] + [w for w in dict.fromkeys(wrong) if w != right][:3]
    rng.shuffle(choices)
    return {"prompt": prompt, "choices": choices, "answer": choices.index(right)}


def arithmetic(rng: random.Random) -> dict:
    a, b = rng.randint(2, 49), rng.randint(2, 49)
    op = rng.choice("+-")
    if op == "-" and b > a:
        a, b = b, a
    right = a + b if op == "+" else a - b
    wrong = [right + 1, right - 1, right + 10, right - 10 if right >= 10 else right + 2, right + 2]
    return choice_row(rng, f"Question: What is {a} {op} {b}?\nAnswer:", str(right), [str(w) for w in wrong])


def follow_format(rng: random.Random) -> dict:
    """The instruction names a format; every choice says the same thing in a different format, so only reading
    the instruction picks the right one."""
    kind = rng.choice(["date", "case", "separator", "json"])
    if kind == "date":
        day, month, year = rng.randint(1, 28), rng.randint(1, 12), rng.randint(1990, 2030)
        forms = {
            "YYYY-MM-DD": f"{year}-{month:02d}-{day:02d}",
            "DD/MM/YYYY": f"{day:02d}/{month:02d}/{year}",
            "Month D, YYYY": f"{MONTHS[month - 1]} {day}, {year}",
            "YYYY/DD/MM": f"{year}/{day:02d}/{month:02d}",
        }
        asked = rng.choice(["YYYY-MM-DD", "DD/MM/YYYY", "Month D, YYYY"])
        prompt = f"Write the date {day} {MONTHS[month - 1]} {year} in the form {asked}.\nAnswer:"
        return choice_row(rng, prompt, forms[asked], [v for k, v in forms.items() if k != asked])
    if kind == "case":
        word = rng.choice(WORDS)
        forms = {
            "capital letters": word.upper(),
            "lower case": word.lower(),
            "title case": word.title(),
            "reverse": word[::-1],
        }
        asked = rng.choice(["capital letters", "lower case", "title case"])
        shown = rng.choice([word.upper(), word.title(), word.lower()])
        return choice_row(
            rng,
            f'Write the word "{shown}" in {asked}.\nAnswer:',
            forms[asked],
            [v for k, v in forms.items() if k != asked],
        )
    if kind == "separator":
        items = rng.sample(WORDS, 3)
        forms = {
            "commas": ", ".join(items),
            "semicolons": "; ".join(items),
            "slashes": " / ".join(items),
            "spaces": " ".join(items),
        }
        asked = rng.choice(["commas", "semicolons", "slashes"])
        return choice_row(
            rng,
            f"List {', '.join(items[:-1])} and {items[-1]}, in that order, separated by {asked}.\nAnswer:",
            forms[asked],
            [v for k, v in forms.items() if k != asked],
        )
    name, age = rng.choice(NAMES), rng.randint(18, 90)
    right = json.dumps({"name": name, "age": age})
    wrong = [f"name: {name}, age: {age}", f"{name} is {age} years old.", f"<name>{name}</name><age>{age}</age>"]
    prompt = f"Give the name {name} and the age {age} as a JSON object with the keys name and age.\nAnswer:"
    return choice_row(rng, prompt, right, wrong)


def copy(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        text = "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(5, 9)))
    else:
        text = " ".join(rng.sample(WORDS, rng.randint(3, 5)))
    return {"prompt": f"Copy the text exactly.\nText: {text}\nCopy:", "target": text}


def order(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        items = [str(n) for n in rng.sample(range(1, 100), 4)]
        right = sorted(items, key=int)
        prompt = f"Sort from smallest to largest: {', '.join(items)}\nAnswer:"
    else:
        items = rng.sample(WORDS, 4)
        right = sorted(items)
        prompt = f"Put in alphabetical order: {', '.join(items)}\nAnswer:"
    # not the order as given: a small model finds a copy of its prompt likeliest, which is not ordering
    wrong = [right[::-1], right[:1] + right[2:3] + right[1:2] + right[3:], right[1:] + right[:1]]
    for _ in range(20):  # more orders, in case some of those coincide with the right one or each other
        wrong.append(rng.sample(right, len(right)))
    return choice_row(rng, prompt, ", ".join(right), [", ".join(w) for w in wrong])


SKILLS = {"arithmetic": arithmetic, "format": follow_format, "copy": copy, "order": order}


def main() -> None:
    for i, (name, make) in enumerate(SKILLS.items()):
        rng = random.Random(1000 + i)
        rows = [make(rng) for _ in range(N_TRAIN + N_TEST)]
        for split, part in (("train", rows[:N_TRAIN]), ("test", rows[N_TRAIN:])):
            with (HERE / f"{name}.{split}.jsonl").open("w") as f:
                f.writelines(json.dumps(r) + "\n" for r in part)


if __name__ == "__main__":
    main()
