"""Made-up words: the generated tiny models' vocabulary, and the text of example traces."""

from __future__ import annotations

import random


def made_up_words(count: int, seed: int) -> list[str]:
    """``count`` distinct pronounceable words, deterministic in ``seed``."""
    rng = random.Random(seed)
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    words: list[str] = []
    seen: set[str] = set()
    syllables = 1
    while len(words) < count:
        for _ in range(4 * count):
            word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables))
            if word not in seen:
                seen.add(word)
                words.append(word)
                if len(words) == count:
                    break
        syllables += 1
    return words
