"""The default training corpus, generated so that `pcp train` needs no download.

A small grammar writes plain English sentences about a village. Its text has clear
structure at several scales (spelling, word order, agreement, repeated names), so a
small model's loss falls visibly below the unigram entropy within a few hundred steps.
"""

import random

NAMES = ["Ada", "Bram", "Cora", "Dunstan", "Elsa", "Finn", "Greta", "Hugo", "Iris", "Jonas"]
TRADES = ["miller", "baker", "smith", "weaver", "shepherd", "fisher", "potter", "carter"]
ADJECTIVES = ["old", "young", "quiet", "clever", "tired", "cheerful", "patient", "stubborn"]
PLACES = ["the river", "the mill", "the market", "the hill", "the forest", "the harbour"]
THINGS = ["bread", "wool", "a basket", "the sheep", "fresh fish", "a clay pot", "the cart"]
VERBS = [("carries", "carried"), ("sells", "sold"), ("mends", "mended"), ("finds", "found")]
MOTIONS = [("walks", "walked"), ("runs", "ran"), ("rides", "rode"), ("wanders", "wandered")]
TIMES = ["in the morning", "at noon", "before dusk", "after the rain", "on market day"]
FEELINGS = ["glad", "hungry", "worried", "proud", "sleepy", "curious"]


def _sentence(rng: random.Random) -> str:
    name, trade = rng.choice(NAMES), rng.choice(TRADES)
    past = rng.random() < 0.4
    tense = 1 if past else 0
    kind = rng.randrange(5)
    if kind == 0:
        verb = rng.choice(VERBS)[tense]
        return f"{name} the {trade} {verb} {rng.choice(THINGS)} {rng.choice(TIMES)}."
    if kind == 1:
        motion = rng.choice(MOTIONS)[tense]
        return f"The {rng.choice(ADJECTIVES)} {trade} {motion} to {rng.choice(PLACES)}."
    if kind == 2:
        was = "was" if past else "is"
        return f"{name} {was} {rng.choice(FEELINGS)}, so {name} {rng.choice(MOTIONS)[tense]} home."
    if kind == 3:
        other = rng.choice(NAMES)
        thing = rng.choice(THINGS)
        return f'"Where is {thing}?" asked {name}. "At {rng.choice(PLACES)[4:]}," said {other}.'
    count = rng.randint(2, 9)
    return f"{name} counts {count} sheep, then {count + 1} sheep, then {count + 2} sheep."


def generate(characters: int = 200_000, seed: int = 0) -> str:
    """Deterministic text of about `characters` characters, in short paragraphs."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    length = 0
    while length < characters:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(2, 5)))
        paragraphs.append(paragraph)
        length += len(paragraph) + 1
    return "\n".join(paragraphs) + "\n"
