"""Write the bundled demo data deterministically: `python -m dragon_dagster.example_data.make_example_data`.

tickets.csv     200 synthetic customer-support tickets (subject, body, product, reply)
arithmetic.csv  400 addition prompts (question, answer) for the GRPO stage

The arithmetic prompts use one- and two-digit operands on purpose: the embedded SmolLM2-135M gets about
half of those right greedily (three-digit sums almost never), so sampled groups contain both right and
wrong answers and a verifiable reward has variance to learn from.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

HERE = Path(__file__).parent

PRODUCTS = {
    "Thermostat T2": ["drops off Wi-Fi", "shows the wrong temperature", "will not hold a schedule", "keeps restarting"],
    "Smart Plug Mini": [
        "cannot be found by the app",
        "turns itself off at night",
        "clicks but the lamp stays off",
        "lost its energy history",
    ],
    "Doorbell Cam": [
        "video lags by several seconds",
        "does not ring the chime",
        "battery drains in two days",
        "night vision is blurry",
    ],
    "Hub Pro": ["went offline after an update", "blinks red", "does not see my sensors", "is very slow to respond"],
    "Motion Sensor": [
        "triggers when nobody is there",
        "never triggers",
        "reports low battery with a new battery",
        "shows as unavailable",
    ],
}

FIXES = {
    "drops off Wi-Fi": "put it on a 2.4 GHz network, since it cannot join 5 GHz, and keep the router within 10 m",
    "shows the wrong temperature": "open Settings > Calibration and set the offset to match a reference thermometer",
    "will not hold a schedule": (
        "check that the time zone in Settings > Device matches your home, then save the schedule again"
    ),
    "keeps restarting": "check that the C-wire is connected, since a weak power supply makes it reboot",
    "cannot be found by the app": (
        "hold the button for 10 seconds until the light blinks blue, then add it again in the app"
    ),
    "turns itself off at night": "open the plug's schedule and remove the old 'Away' rule that switches it off",
    "clicks but the lamp stays off": "try another lamp, and if that works, the lamp's own switch is off",
    "lost its energy history": "update the app to the latest version: history is kept on the server and comes back",
    "video lags by several seconds": (
        "lower the stream quality to 720p in the camera settings, or move the router closer"
    ),
    "does not ring the chime": "re-pair the chime from Settings > Chime and test it with the button in the app",
    "battery drains in two days": "turn off continuous motion recording and set the motion zone smaller",
    "night vision is blurry": "wipe the lens and remove the protective film, which reflects the infrared light",
    "went offline after an update": "unplug it for 30 seconds and plug it back in so it finishes the update",
    "blinks red": "check the Ethernet cable or Wi-Fi password: red means it has no internet connection",
    "does not see my sensors": "move the hub to a central spot and re-pair the sensors one at a time",
    "is very slow to respond": "restart it from Settings > Hub > Restart and remove automations you no longer use",
    "triggers when nobody is there": "lower the sensitivity and point it away from heaters and windows",
    "never triggers": "make sure it is mounted 2 m high and that 'Away mode only' is turned off",
    "reports low battery with a new battery": "take the battery out for 10 seconds so the sensor resets its reading",
    "shows as unavailable": "bring it closer to the hub or add a plug in between to extend the network",
}

OPENERS = ["Hi,", "Hello,", "Hey support,", "Good morning,", "Hi team,"]
CONTEXT = [
    "since yesterday",
    "for a week now",
    "after I moved it to another room",
    "since the last app update",
    "every evening",
    "since I changed my router",
]
ASKS = ["What should I do?", "Can you help?", "Is it broken?", "How do I fix this?", "Any ideas?"]
NAMES = ["Alex", "Sam", "Priya", "Jonas", "Maria", "Chen", "Fatima", "Luca", "Emma", "Kofi"]


def tickets(n: int = 200, seed: int = 42) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        product = rng.choice(sorted(PRODUCTS))
        problem = rng.choice(PRODUCTS[product])
        opener, context, ask, name = (rng.choice(OPENERS), rng.choice(CONTEXT), rng.choice(ASKS), rng.choice(NAMES))
        key = (product, problem, context, ask, name)
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            {
                "subject": f"{product} {problem}",
                "body": f"{opener} my {product} {problem} {context}. {ask}\n{name}",
                "product": product,
                "reply": f"Hi {name}, sorry about the trouble with your {product}. Please {FIXES[problem]}. "
                "If that does not help, reply here and we will arrange a replacement.",
            }
        )
    return rows


def arithmetic(n: int = 400, seed: int = 42) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"question": f"What is {a} + {b}? Reply with just the number.", "answer": str(a + b)})
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    write_csv(HERE / "tickets.csv", tickets())
    write_csv(HERE / "arithmetic.csv", arithmetic())
    print(f"wrote {HERE / 'tickets.csv'} and {HERE / 'arithmetic.csv'}")
