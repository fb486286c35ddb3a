"""Arithmetic word problems with worked, uncertain solutions: the ``arith`` workload's tasks.

In the spirit of GSM8K: a story with several quantities (a starting amount, then changes: gains,
losses, and groups of equal size bought or given away, one change a day from monday on) and the
question "how many ... now ?".
The answer is a worked solution, one arithmetic step per sentence ("12 plus 7 is 19 ."), two to
six steps, ending with ``answer N``; it is scored like GSM8K, by its final number, with a check
that each step's arithmetic is right (:func:`check_solution`).

Each step is a local lookup for a small model: numbers are single word-level tokens
(``0`` .. ``RANGES.max_value``), additions and subtractions of small numbers, products from a small
multiplication table (:data:`GROUP_COUNTS` x :data:`GROUP_SIZES`). What is uncertain is the
wording, so the next-token distribution has real entropy and the answer length varies given the
prompt: every training solution is drawn among equally valid ones -

* step order: the products of the group changes either inline, just before each is used, or
  all first (``first , tuesday : 3 times 4 is 12 .``);
* the day of each step, named before its arithmetic (``on tuesday ,`` / ``tuesday :`` /
  ``then on tuesday ,``): which story quantity a step uses is found by its day, not by counting
  sentences (a 2.7M-parameter model trained on stories without days read the right operand for
  a quarter of the steps after 600 steps of batch 32);
* optional sentences: restating the start, a lead clause before a step ("then she loses 4 ,"),
  the running amount after it ("now she has 15 ."), a closing sentence;
* synonyms: ``plus`` / ``+`` / ``adding k to x gives``, ``is`` / ``equals`` / ``=``, and the
  like for minus and times.

A request is drawn from a seed (``numpy.random.default_rng``), so every split is the same on
every machine; answers are 20 .. :data:`MAX_ANSWER_TOKENS` tokens (shorter or longer wordings are
drawn again), so answer, end of turn and padding fit the 128-position response window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..tasks import split_rng


@dataclass(frozen=True)
class Ranges:
    """The numbers a problem draws: every quantity, product and running amount stays in
    ``0..max_value``; the start amount in ``start``, a plain change in ``change`` (both inclusive)."""

    max_value: int
    start: tuple[int, int]
    change: tuple[int, int]


# The workload's problems (every split, the demo, the calibration): values 0..20, changes 1..5,
# about 200 addition, subtraction and multiplication facts. With 0..60 and changes up to 15 (about
# 1800 facts) a 2.7M-parameter model learnt the story's structure after 1500 steps of batch 32 but
# only 17% of the results; with 0..30 and changes 1..9 (about 500 facts, WIDE_RANGES) and the days
# it read 95% of the operands right after 3000 steps but computed 40% of the results (48% on
# drills, the facts in the prompt). The trainer starts on WIDE_RANGES and finishes on RANGES (the
# Makefile's phases).
RANGES = Ranges(max_value=20, start=(5, 15), change=(1, 5))
WIDE_RANGES = Ranges(max_value=30, start=(5, 20), change=(1, 9))
GROUP_COUNTS = (2, 3, 4)
GROUP_SIZES = (2, 3, 4, 5)
MIN_STEPS, MAX_STEPS = 2, 6
MIN_ANSWER_TOKENS, MAX_ANSWER_TOKENS = 20, 120
TRAIN_SEED = 0
HELDOUT_SEED = 1_000_003

# ------------------------------------------------------------------------------------ words
NAMES = {"ann": "she", "mia": "she", "lily": "she", "zoe": "she", "ben": "he", "tom": "he", "sam": "he",
         "max": "he"}
OBJECT_PRONOUN = {"she": "her", "he": "him"}
ITEMS = ["apples", "pens", "cards", "stickers", "marbles", "books", "cookies", "coins", "shells", "stamps"]
CONTAINERS = ["bags", "boxes", "packs", "jars"]
FRIENDS = ["friends", "classmates", "cousins"]
# every change of a story happens on its own day, in week order; a solution names the day of each
# step, so which quantity a step uses is found by its day (as GSM8K's "on monday ... on tuesday")
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
NUMBER_WORDS = [str(i) for i in range(100)]

PLUS_FORMS = ("{x} plus {k} is {y} .", "{x} plus {k} equals {y} .", "{x} + {k} = {y} .",
              "adding {k} to {x} gives {y} .")
MINUS_FORMS = ("{x} minus {k} is {y} .", "{x} minus {k} equals {y} .", "{x} - {k} = {y} .",
               "taking {k} from {x} leaves {y} .")
TIMES_FORMS = ("{m} times {k} is {p} .", "{m} times {k} equals {p} .", "{m} x {k} = {p} .",
               "{m} groups of {k} make {p} .")

# every word the templates below can write (the tokenizer's vocabulary, with NUMBER_WORDS)
OTHER_WORDS = ["has", "starts", "with", "owns", "buys", "more", "finds", "gives", "gets", "from", "to", "loses",
               "sells", "uses", "of", "in", "each", "how", "many", "does", "have", "now", "at", "the", "end", "then",
               "after", "that", "away", "so", "left", "first", "plus", "minus", "times", "is", "equals", "adding",
               "taking", "leaves", "groups", "make", "answer", "all", "together", "she", "he", "her", "him",
               ".", ",", "?", "+", "-", "=", "x", "user", "assistant", "system", "practice", ":", "on"]


def vocabulary_words() -> list[str]:
    """All ordinary words of the workload's tokenizer (no special tokens), fixed order, no repeats."""
    words: list[str] = []
    for group in (NUMBER_WORDS, list(NAMES), ITEMS, CONTAINERS, FRIENDS, DAYS, OTHER_WORDS):
        for w in group:
            if w not in words:
                words.append(w)
    return words


# ------------------------------------------------------------------------------------ problems
@dataclass(frozen=True)
class Change:
    """One change of the running amount: ``sign`` +1 (gain) or -1 (loss) of ``amount``; a group
    change (``count`` > 0) is ``count`` groups of ``size`` (``amount = count * size``)."""

    sign: int
    amount: int
    count: int = 0
    size: int = 0
    sentence: str = ""

    @property
    def is_group(self) -> bool:
        return self.count > 0


@dataclass
class ArithRequest:
    """One problem: ``question`` (the story and the question), ``answer`` (one worked solution,
    space-separated words), ``value`` (the final amount: the answer's number), ``start`` and
    ``changes`` (the story), ``steps`` (the arithmetic steps of the solution), ``kind``
    (``"steps<n>"``). Text only: ``image`` is None and ``has_image`` False, as the trainer's
    requests of the demo model without an image."""

    kind: str
    question: str
    answer: str
    value: int
    start: int
    changes: list[Change] = field(repr=False)
    image: None = None

    @property
    def answer_tokens(self) -> int:
        return len(self.answer.split())

    @property
    def steps(self) -> int:
        return len(self.changes) + sum(c.is_group for c in self.changes)

    @property
    def has_image(self) -> bool:
        return False

    @property
    def prompt_text(self) -> str:
        return self.question

    def image_input(self):
        return None


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _draw_changes(rng: np.random.Generator, start: int, n_changes: int, n_groups: int,
                  ranges: Ranges) -> list[tuple] | None:
    """Signs and amounts of ``n_changes`` changes (``n_groups`` of them group changes, at random
    places) keeping the running amount in ``0..ranges.max_value``; None when a draw cannot."""
    max_value, change = ranges.max_value, ranges.change
    group_at = set(rng.choice(n_changes, size=n_groups, replace=False).tolist()) if n_groups else set()
    value, out = start, []
    for i in range(n_changes):
        sign = 1 if rng.random() < 0.5 else -1
        if i in group_at:
            pairs = [(m, s) for m in GROUP_COUNTS for s in GROUP_SIZES
                     if (value + m * s <= max_value if sign > 0 else m * s <= value)]
            if not pairs:
                sign = -sign
                pairs = [(m, s) for m in GROUP_COUNTS for s in GROUP_SIZES
                         if (value + m * s <= max_value if sign > 0 else m * s <= value)]
            if not pairs:
                return None
            m, s = _pick(rng, pairs)
            out.append((sign, m * s, m, s))
        else:
            hi = min(change[1], max_value - value if sign > 0 else value)
            if hi < change[0]:
                sign = -sign
                hi = min(change[1], max_value - value if sign > 0 else value)
            if hi < change[0]:
                return None
            k = int(rng.integers(change[0], hi + 1))
            out.append((sign, k, 0, 0))
        value += out[-1][0] * out[-1][1]
    return out


def _change_sentence(rng, change: tuple, name: str, items: str) -> str:
    sign, amount, count, size = change
    pron = NAMES[name]
    other = _pick(rng, [n for n in NAMES if n != name])
    if count:
        box = _pick(rng, CONTAINERS)
        if sign > 0:
            return _pick(rng, [f"{pron} buys {count} {box} of {size} {items} .",
                               f"{pron} gets {count} {box} with {size} {items} in each ."])
        return _pick(rng, [f"{pron} gives {size} {items} to each of {count} {_pick(rng, FRIENDS)} .",
                           f"{pron} sells {count} {box} of {size} {items} ."])
    if sign > 0:
        return _pick(rng, [f"{pron} buys {amount} more {items} .", f"{pron} finds {amount} {items} .",
                           f"{other} gives {OBJECT_PRONOUN[pron]} {amount} {items} ."])
    return _pick(rng, [f"{pron} gives {amount} {items} to {other} .", f"{pron} loses {amount} {items} .",
                       f"{pron} sells {amount} {items} .", f"{pron} uses {amount} {items} ."])


@dataclass(frozen=True)
class Story:
    """A drawn problem: who (``name``), what (``items``), the ``question`` text, the ``start``
    amount and the ``changes`` in story order."""

    name: str
    items: str
    question: str
    start: int
    changes: tuple[Change, ...]


def make_problem(rng: np.random.Generator, *, ranges: Ranges = RANGES, end_marker: bool = True) -> Story:
    """One story with 2..6 arithmetic steps, its numbers drawn in ``ranges``; with ``end_marker``
    its last change says so (:data:`LAST_DAY_TAG`), without it every change reads "on <day>" (the
    stories before the marker, which the shipped model's first two phases trained on)."""
    while True:
        n_steps = int(rng.integers(MIN_STEPS, MAX_STEPS + 1))
        n_groups = int(rng.integers(0, n_steps // 2 + 1))  # each group change is two steps
        n_changes = n_steps - n_groups
        if n_changes < max(1, n_groups):
            continue
        start = int(rng.integers(ranges.start[0], ranges.start[1] + 1))
        drawn = _draw_changes(rng, start, n_changes, n_groups, ranges)
        if drawn is not None:
            break
    name = _pick(rng, list(NAMES))
    pron, items = NAMES[name], _pick(rng, ITEMS)
    opening = _pick(rng, [f"{name} has {start} {items} .", f"{name} starts with {start} {items} .",
                          f"{name} owns {start} {items} ."])
    last = len(drawn) - 1 if end_marker else -1
    changes = tuple(Change(s, a, c, z, (LAST_DAY_TAG if i == last else "on {day}").format(day=day) + " "
                           + _change_sentence(rng, (s, a, c, z), name, items))
                    for i, (day, (s, a, c, z)) in enumerate(zip(DAYS, drawn)))
    ask = _pick(rng, [f"how many {items} does {name} have now ?", f"how many {items} does {pron} have at the end ?"])
    return Story(name, items, " ".join([opening, *(c.sentence for c in changes), ask]), start, changes)


DAY_TAGS = ("on {day} ,", "{day} :")
LATER_DAY_TAGS = ("then on {day} ,",)
# the story's last change and the solution's last step say so in the same words: where the answer
# ends is read from the story by content (as each step's operand is found by its day), not by
# noticing that the story has no later day. Alone it did not stop the runaway answers (a model
# trained without it ran 17 of 24 held-out answers to the window's end; with it, still most): the
# trainer's semi-autoregressive masking (--semi-ar) did (bench/RESULTS.md, "The arith workload")
LAST_DAY_TAG = "at the end , on {day}"


def write_solution(rng: np.random.Generator, story: Story, *, end_marker: bool = True) -> str:
    """One worked solution of ``story``, drawn among the equally valid ones (module docstring);
    ``end_marker`` as :func:`make_problem`'s (without it the last step's day tag is drawn like
    the others' and a closing sentence may read "at the end <name> has ...")."""
    name, items, start, changes = story.name, story.items, story.start, story.changes
    pron = NAMES[name]
    parts: list[str] = []
    if rng.random() < 0.4:
        parts.append(_pick(rng, [f"{name} has {start} {items} .", f"{name} starts with {start} ."]))
    groups_first = any(c.is_group for c in changes) and rng.random() < 0.4
    if groups_first:
        for j, (day, c) in enumerate((d, c) for d, c in zip(DAYS, changes) if c.is_group):
            lead = "first , " if j == 0 and rng.random() < 0.5 else ""
            parts.append(lead + f"{day} : " + _pick(rng, TIMES_FORMS).format(m=c.count, k=c.size, p=c.amount))
    value = start
    for i, (day, c) in enumerate(zip(DAYS, changes)):
        if end_marker and i == len(changes) - 1:
            parts.append(LAST_DAY_TAG.format(day=day) + " ,")
        else:
            parts.append(_pick(rng, DAY_TAGS if i == 0 else DAY_TAGS + LATER_DAY_TAGS).format(day=day))
        if c.is_group and not groups_first:
            parts.append(_pick(rng, TIMES_FORMS).format(m=c.count, k=c.size, p=c.amount))
        if rng.random() < 0.4:
            if c.sign > 0:
                parts.append(_pick(rng, [f"{pron} gets {c.amount} more ,", f"then {pron} gets {c.amount} ,",
                                         f"after that {pron} gets {c.amount} more ,"]))
            else:
                parts.append(_pick(rng, [f"{pron} gives away {c.amount} ,", f"then {pron} loses {c.amount} ,",
                                         f"after that {pron} uses {c.amount} ,"]))
        new = value + c.sign * c.amount
        parts.append(_pick(rng, PLUS_FORMS if c.sign > 0 else MINUS_FORMS).format(x=value, k=c.amount, y=new))
        value = new
        if rng.random() < 0.25:
            parts.append(_pick(rng, [f"now {pron} has {value} .", f"so {pron} has {value} {items} ."]))
    if rng.random() < 0.5:
        closing = f"now {name} has {value} {items} ." if end_marker else f"at the end {name} has {value} {items} ."
        parts.append(_pick(rng, [f"so {name} has {value} {items} now .", closing]))
    parts.append(f"answer {value}")
    return " ".join(parts)


def make_request(rng: np.random.Generator, *, ranges: Ranges = RANGES, end_marker: bool = True) -> ArithRequest:
    """One problem (numbers in ``ranges``) and one of its worked solutions, 20..120 answer tokens
    long (``end_marker``: :func:`make_problem`)."""
    while True:
        story = make_problem(rng, ranges=ranges, end_marker=end_marker)
        for _ in range(8):  # a wording of the right length; a 2-step story's terse ones are too short
            answer = write_solution(rng, story, end_marker=end_marker)
            if MIN_ANSWER_TOKENS <= len(answer.split()) <= MAX_ANSWER_TOKENS:
                value = story.start + sum(c.sign * c.amount for c in story.changes)
                n_steps = len(story.changes) + sum(c.is_group for c in story.changes)
                return ArithRequest(f"steps{n_steps}", story.question, answer, value, story.start,
                                    list(story.changes))


def make_requests(n: int, split: str = "heldout", seed: int | None = None) -> list[ArithRequest]:
    """``n`` requests of ``split`` ("train" or "heldout"; the seeds differ), deterministic.

    ``seed`` overrides the split's seed (:data:`TRAIN_SEED` / :data:`HELDOUT_SEED`).
    """
    rng = split_rng(split, n, seed, train_seed=TRAIN_SEED, heldout_seed=HELDOUT_SEED)
    return [make_request(rng) for _ in range(n)]


def make_drill(rng: np.random.Generator, *, ranges: Ranges = RANGES) -> ArithRequest:
    """A training-only arithmetic drill: the prompt lists 8-14 facts to work out ("practice : 5
    plus 3 , 12 minus 4 , 2 times 3 ."), the answer works each out in the solutions' wordings.

    Why: in a word problem a result is a clean example of its fact only when it is masked and
    both operands are not (probability t (1 - t)^2, 1/12 on average over LLaDA's t ~ U(0, 1));
    here the operands sit in the prompt, which is never masked, so every masked result is one.
    A 2.7M-parameter model trained on word problems alone got 31% of the results right after
    1500 steps (teacher-forced), with the story's structure already learnt. Not in any split.
    """
    facts, shown = [], []
    for _ in range(int(rng.integers(8, 15))):
        u = rng.random()
        if u < 0.12:
            m, k = int(_pick(rng, GROUP_COUNTS)), int(_pick(rng, GROUP_SIZES))
            shown.append(f"{m} times {k}")
            facts.append(_pick(rng, TIMES_FORMS).format(m=m, k=k, p=m * k))
            continue
        k = int(rng.integers(ranges.change[0], ranges.change[1] + 1))
        if u < 0.56:
            x = int(rng.integers(0, ranges.max_value - k + 1))
            shown.append(f"{x} plus {k}")
            facts.append(_pick(rng, PLUS_FORMS).format(x=x, k=k, y=x + k))
        else:
            x = int(rng.integers(k, ranges.max_value + 1))
            shown.append(f"{x} minus {k}")
            facts.append(_pick(rng, MINUS_FORMS).format(x=x, k=k, y=x - k))
    answer = " ".join(facts)
    last = check_solution(answer).steps[-1]
    return ArithRequest("drill", "practice : " + " , ".join(shown) + " .", answer, last[3], 0, [])


class RequestStream:
    """An endless deterministic stream of training requests (``next_batch(k)``), as the trainer
    reads the demo model's: ``drill`` is the probability of an arithmetic drill
    (:func:`make_drill`) instead of a word problem; ``ranges`` the numbers both draw."""

    def __init__(self, seed: int, *, drill: float = 0.0, ranges: Ranges = RANGES, end_marker: bool = True):
        if not 0.0 <= drill <= 1.0:
            raise ValueError(f"drill must be a probability in [0, 1], got {drill!r}")
        self.rng = np.random.default_rng([seed, 0])
        self.drill, self.ranges, self.end_marker = drill, ranges, end_marker

    def _one(self) -> ArithRequest:
        if self.drill and self.rng.random() < self.drill:
            return make_drill(self.rng, ranges=self.ranges)
        return make_request(self.rng, ranges=self.ranges, end_marker=self.end_marker)

    def next_batch(self, k: int) -> list[ArithRequest]:
        return [self._one() for _ in range(k)]


# ------------------------------------------------------------------------------------ checking
_NUM = r"(\d+)"
_STEP_PATTERNS = [  # (regex, operation, which groups are (left, right, result))
    (re.compile(rf"{_NUM} plus {_NUM} (?:is|equals) {_NUM}"), "+", (1, 2, 3)),
    (re.compile(rf"{_NUM} \+ {_NUM} = {_NUM}"), "+", (1, 2, 3)),
    (re.compile(rf"adding {_NUM} to {_NUM} gives {_NUM}"), "+", (2, 1, 3)),
    (re.compile(rf"{_NUM} minus {_NUM} (?:is|equals) {_NUM}"), "-", (1, 2, 3)),
    (re.compile(rf"{_NUM} - {_NUM} = {_NUM}"), "-", (1, 2, 3)),
    (re.compile(rf"taking {_NUM} from {_NUM} leaves {_NUM}"), "-", (2, 1, 3)),
    (re.compile(rf"{_NUM} times {_NUM} (?:is|equals) {_NUM}"), "*", (1, 2, 3)),
    (re.compile(rf"{_NUM} x {_NUM} = {_NUM}"), "*", (1, 2, 3)),
    (re.compile(rf"{_NUM} groups of {_NUM} make {_NUM}"), "*", (1, 2, 3)),
]
_FINAL = re.compile(rf"(?:^|\s)answer {_NUM}$")
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class SolutionCheck:
    """What :func:`check_solution` found: ``final`` (the number after the closing ``answer``, or
    None when the text does not end with ``answer N``), ``steps`` (``(left, op, right, claimed)``
    in text order), ``wrong_steps`` (those whose claimed result is not ``left op right``)."""

    final: int | None
    steps: tuple[tuple[int, str, int, int], ...]
    wrong_steps: tuple[tuple[int, str, int, int], ...]

    @property
    def steps_right(self) -> bool:
        """At least one step, and every step's arithmetic right."""
        return bool(self.steps) and not self.wrong_steps


def check_solution(text: str) -> SolutionCheck:
    """Parse a worked solution (space-separated words): its arithmetic steps, in every wording the
    generator writes, and its final ``answer N``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = " ".join(text.split())
    found = []
    for pattern, op, (li, ri, yi) in _STEP_PATTERNS:
        for m in pattern.finditer(text):
            found.append((m.start(), (int(m.group(li)), op, int(m.group(ri)), int(m.group(yi)))))
    steps = tuple(s for _, s in sorted(found))
    wrong = tuple(s for s in steps if _APPLY[s[1]](s[0], s[2]) != s[3])
    final = _FINAL.search(text)
    return SolutionCheck(None if final is None else int(final.group(1)), steps, wrong)


def score(request: ArithRequest | int, text: str) -> bool:
    """GSM8K's score: the solution ends with ``answer N`` and N is the problem's answer.

    request: the problem, or its answer value directly."""
    value = request if isinstance(request, int) else request.value
    return check_solution(text).final == value
