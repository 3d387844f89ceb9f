"""Verifiable tasks with rule-based rewards for GRPO on the tiny MoE (docs/RL.md section 8).

``AdditionTask``: prompts "BOS a + b =" with a, b drawn from [0, 10**digits), answer the decimal
digits of a + b followed by EOS. The reward is computed from the tokens alone (no model): 1.0 for
the exact answer then EOS; for another well-formed answer (only digits, ended by EOS) a
closeness credit 0.8 x max(0, 1 - |n - (a + b)| / (2 x 10**digits)); anything else 0. The
closeness credit is what lets a model trained from scratch show a rising reward within minutes:
it learns the format and the rough size of sums long before exact ones (a digit-position credit
was tried first: a tiny model from scratch barely moved on it).

Vocabulary: 0-9 are the digits, then '+', '=', EOS (the stop token) and BOS; ``vocab`` = 14.
Prompts are seeded by (seed, index), so any process regenerates any prompt.
"""

import random
from typing import List, Tuple

PLUS, EQUALS, EOS, BOS = 10, 11, 12, 13
VOCAB = 14
REWARD_SOURCE = "rule:add"


def _digits(n: int) -> List[int]:
    return [int(c) for c in str(n)]


class AdditionTask:
    vocab = VOCAB
    stop_token = EOS
    reward_source = REWARD_SOURCE

    def __init__(self, digits: int = 1, seed: int = 0):
        if digits < 1:
            raise ValueError(f"digits must be >= 1, got {digits}")
        self.digits, self.seed = digits, seed

    def operands(self, index: int) -> Tuple[int, int]:
        rng = random.Random(self.seed * 1_000_003 + index)
        hi = 10 ** self.digits
        return rng.randrange(hi), rng.randrange(hi)

    def prompt(self, index: int) -> List[int]:
        a, b = self.operands(index)
        return [BOS] + _digits(a) + [PLUS] + _digits(b) + [EQUALS]

    def answer(self, index: int) -> List[int]:
        a, b = self.operands(index)
        return _digits(a + b) + [EOS]

    def max_new_tokens(self) -> int:
        return self.digits + 2  # the longest sum plus EOS

    def reward(self, index: int, output: List[int]) -> float:
        """The rule-based reward of ``output`` (generated tokens) for prompt ``index``."""
        answer = self.answer(index)
        if list(output) == answer:
            return 1.0
        if len(output) < 2 or output[-1] != EOS or any(t > 9 for t in output[:-1]):
            return 0.0
        n = int("".join(str(t) for t in output[:-1]))
        a, b = self.operands(index)
        return 0.8 * max(0.0, 1.0 - abs(n - (a + b)) / (2 * 10 ** self.digits))

    @staticmethod
    def decode(tokens: List[int]) -> str:
        names = {PLUS: "+", EQUALS: "=", EOS: "$", BOS: "^"}
        return "".join(names.get(t, str(t)) for t in tokens)
