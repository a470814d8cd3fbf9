"""A repetitive, structured workload that is not ours: JSON extraction over similar records.

Each request asks the model to pull four facts out of one sentence about a person and answer with one JSON object.
The sentences vary (names, ages, cities, jobs, six phrasings), the answers repeat their shape: the traffic of an
extraction job or an agent's tool step, where suffix decoding drafts from earlier answers. Generated from a fixed
seed, so every run (and every peer) gets the same requests; `python -m bench.structured_workload` prints them.
"""
from __future__ import annotations

import json
import random
import sys

from bench.workloads import Workload

SEED = 20261206
SYSTEM = ("You extract facts from text. Reply with one JSON object with the keys \"name\", \"age\", \"city\" and "
          "\"job\", and nothing else.")
_FIRST = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal", "Lena",
          "Marta", "Nils", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tara")
_LAST = ("Berg", "Costa", "Dubois", "Evans", "Fischer", "Garcia", "Hansen", "Ito", "Jensen", "Kowalski", "Larsen",
         "Moreau", "Novak", "Okafor", "Petrov", "Rossi", "Schmidt", "Tanaka", "Urban", "Weber")
_CITIES = ("Lisbon", "Oslo", "Vienna", "Madrid", "Prague", "Dublin", "Warsaw", "Athens", "Helsinki", "Zurich")
_JOBS = ("nurse", "teacher", "engineer", "baker", "pilot", "lawyer", "farmer", "chemist", "architect", "plumber")
_PHRASINGS = (
    "{name} is a {age}-year-old {job} who lives in {city}.",
    "Born {age} years ago, {name} now works as a {job} in {city}.",
    "In {city}, the {job} {name} (aged {age}) opened a small office last spring.",
    "Our new neighbour {name}, {age}, moved here from {city} and works as a {job}.",
    "{name} has been a {job} for years; at {age} they still live in {city}.",
    "Meet {name}: {job} by trade, {age} years old, resident of {city}.",
)


def records(n: int, seed: int = SEED) -> list[dict[str, str | int]]:
    rng = random.Random(seed)
    return [{"name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", "age": rng.randint(19, 78),
             "city": rng.choice(_CITIES), "job": rng.choice(_JOBS), "phrasing": rng.randrange(len(_PHRASINGS))}
            for _ in range(n)]


def extraction_workloads(n: int, seed: int = SEED) -> list[Workload]:
    """``n`` extraction requests, the same for the same ``n`` and seed (a longer list extends a shorter one)."""
    out = []
    for i, rec in enumerate(records(n, seed)):
        sentence = _PHRASINGS[int(rec["phrasing"])].format(**rec)
        out.append(Workload(name=f"extract-{i}", messages=[{"role": "system", "content": SYSTEM},
                                                           {"role": "user", "content": sentence}]))
    return out


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    for w in extraction_workloads(count):
        print(json.dumps({"name": w.name, "messages": w.messages}))
