"""Deterministic tasks of the embedded demo model: drawn images with questions, and text tasks.

Every request is generated from a seed (``numpy.random.default_rng``), so a split is the same on
every machine. Answers are space-separated vocabulary words (one word = one token of the
word-level tokenizer), and their lengths are spread over 1 .. :data:`MAX_ANSWER_TOKENS` so that
truncating the fixed response window matters.

Images (48x48 px, one view): a 3x3 grid of 16 px cells, each empty or holding one coloured
shape (:data:`COLOURS` x :data:`SHAPES`), at most :data:`MAX_SHAPES` (6) shapes per image. With
the tower's 8 px patches a cell is 2x2 patches, and LaViDa's 2x2 bilinear pooling turns it into
exactly one LLM token (9 tokens + newline).

Question families (answer lengths in brackets). Every answer's length is fixed by the prompt (a
number word) or is one or two words, so the model can know where its answer ends at step 0:

======  ===========================================================  ==========================
image   "how many red shapes are there ?" / "how many circles ..."   1 (counts 0..6)
image   "is there a blue square ?" -> "yes" / "no"                   1
image   "what colour is the shape in the top left ?" / "what shape"  1
image   "what is in the top left ?" -> "green circle" / "nothing"    1-2
image   "repeat the colour of the shape in the top left four times"  2-20 (read from the image)
text    "repeat apple four times" / "repeat big red apple two times"  1-30
text    "count to seven" -> "one two ... seven"                      1-20
text    "list the first five letters" -> "a b c d e"                 1-20
text    "what comes after seven ?" / "what comes before seven ?"     1
======  ===========================================================  ==========================

A request is made by drawing a target answer length first (:func:`_target_length`: 30% one
token, 6% two, the rest uniform over 3..30 but 23, 25 and 29, which no family makes), then a family
able to produce it. (A first version also asked for whole-grid lists, ranges and spellings; a
2.8M-parameter model trained for an hour on 2 CPU cores read them at 0-50% exact match, see
bench/RESULTS.md, so they were dropped: the demo needs a model that is right, not a hard one.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# ------------------------------------------------------------------------------------ words
COLOURS = ["red", "green", "blue", "yellow"]
COLOUR_RGB = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 230), "yellow": (235, 205, 30)}
SHAPES = ["circle", "square", "triangle"]
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
ROWS = ["top", "middle", "bottom"]
COLS = ["left", "center", "right"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
           "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
           "twenty"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
NOUNS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "pear", "plum", "melon", "cat",
         "dog", "bird", "fish", "horse", "mouse", "tiger", "zebra", "house", "tree", "star", "moon", "sun",
         "book", "car", "boat", "elephant", "kangaroo", "pineapple", "butterfly", "dinosaur", "strawberry",
         "watermelon"]
ADJECTIVES = ["big", "small", "happy", "old", "new", "little"]
OTHER_WORDS = ["how", "many", "shapes", "are", "there", "is", "a", "what", "in", "the", "colour", "of",
               "shape", "list", "first", "count", "to", "repeat", "times", "letters", "comes", "after",
               "before", "nothing", "yes", "no", "?", "user", "assistant", "system"]


def vocabulary_words() -> list[str]:
    """All ordinary words of the tokenizer (no special tokens), in a fixed order without repeats."""
    words: list[str] = []
    for group in (LETTERS, NUMBERS, COLOURS, SHAPES, list(PLURAL.values()), ROWS, COLS, NOUNS, ADJECTIVES,
                  OTHER_WORDS):
        for w in group:
            if w not in words:
                words.append(w)
    return words


MAX_ANSWER_TOKENS = 30
MAX_SHAPES = 6  # shapes per image
IMAGE_SIZE = 48
CELL = IMAGE_SIZE // 3
TRAIN_SEED = 0
HELDOUT_SEED = 1_000_003


@dataclass
class TaskRequest:
    """One request: ``question`` (without the ``<image>`` marker), ``answer`` (space-separated
    words), ``answer_tokens`` (its token count), ``image`` (a PIL image or None), ``grid``
    (the 3x3 cell contents, ``None`` entries empty, or None for text tasks), ``kind`` (family)."""

    kind: str
    question: str
    answer: str
    image: object | None = None
    grid: list | None = field(default=None, repr=False)

    @property
    def answer_tokens(self) -> int:
        return len(self.answer.split())

    @property
    def has_image(self) -> bool:
        return self.image is not None

    @property
    def prompt_text(self) -> str:
        """The user turn's content as the tokenizer wrapper expects it (``<image>`` first)."""
        return ("<image> " if self.has_image else "") + self.question

    def image_input(self):
        """The image as :class:`model_adapters.ImageInput` (one 48x48 view, mean = std = 0.5)."""
        if self.image is None:
            return None
        from model_adapters.lavida import process_image

        return process_image(self.image, image_size=IMAGE_SIZE, anyres=False)


# ------------------------------------------------------------------------------------ images
def draw_grid(grid: list, rng: np.random.Generator):
    """Render a 3x3 grid (row-major list of 9 entries ``(colour, shape)`` or None) as a PIL image.

    Small jitter (position +-1 px, size, colour +-12, background shade) so that the vision tower
    learns shapes and colours rather than exact pixels; the jitter comes from ``rng``.
    """
    from PIL import Image, ImageDraw

    bg = int(rng.integers(225, 250))
    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (bg, bg, bg))
    d = ImageDraw.Draw(img)
    for idx, cell in enumerate(grid):
        if cell is None:
            continue
        colour, shape = cell
        r, c = divmod(idx, 3)
        cx = c * CELL + CELL / 2 - 0.5 + float(rng.integers(-1, 2))
        cy = r * CELL + CELL / 2 - 0.5 + float(rng.integers(-1, 2))
        half = float(rng.integers(5, 7))
        rgb = tuple(int(np.clip(v + rng.integers(-12, 13), 0, 255)) for v in COLOUR_RGB[colour])
        if shape == "circle":
            d.ellipse([cx - half, cy - half, cx + half, cy + half], fill=rgb)
        elif shape == "square":
            h = half - 1
            d.rectangle([cx - h, cy - h, cx + h, cy + h], fill=rgb)
        else:
            d.polygon([(cx, cy - half), (cx - half, cy + half), (cx + half, cy + half)], fill=rgb)
    return img


def _random_grid(rng: np.random.Generator, n_shapes: int) -> list:
    grid: list = [None] * 9
    for idx in rng.choice(9, size=n_shapes, replace=False):
        grid[int(idx)] = (COLOURS[int(rng.integers(len(COLOURS)))], SHAPES[int(rng.integers(len(SHAPES)))])
    return grid


def _cell_name(idx: int) -> str:
    r, c = divmod(idx, 3)
    return f"{ROWS[r]} {COLS[c]}"


def _cell_words(cell) -> str:
    return "nothing" if cell is None else f"{cell[0]} {cell[1]}"


def _join(items: list[str]) -> str:
    return " , ".join(items) if items else "nothing"


# ------------------------------------------------------------------------------------ families
# Each family takes (rng, target length) and returns (kind, question, answer, grid-or-None), or
# None when it cannot produce that length. Every answer's length follows from the prompt (a
# number word) or is one or two words: the model can know it at step 0, which is what Seer reads.
def _img_count(rng, n):
    if n != 1:
        return None
    grid = _random_grid(rng, int(rng.integers(0, MAX_SHAPES + 1)))
    shapes = [c for c in grid if c is not None]
    mode = int(rng.integers(3))
    if mode == 0:
        col = COLOURS[int(rng.integers(len(COLOURS)))]
        k = sum(c[0] == col for c in shapes)
        return "count_colour", f"how many {col} shapes are there ?", NUMBERS[k], grid
    if mode == 1:
        shp = SHAPES[int(rng.integers(len(SHAPES)))]
        k = sum(c[1] == shp for c in shapes)
        return "count_shape", f"how many {PLURAL[shp]} are there ?", NUMBERS[k], grid
    return "count_all", "how many shapes are there ?", NUMBERS[len(shapes)], grid


def _img_yesno(rng, n):
    if n != 1:
        return None
    grid = _random_grid(rng, int(rng.integers(1, MAX_SHAPES + 1)))
    shapes = [c for c in grid if c is not None]
    if rng.random() < 0.5:  # ask about something present: balanced yes / no
        col, shp = shapes[int(rng.integers(len(shapes)))]
    else:
        col, shp = COLOURS[int(rng.integers(len(COLOURS)))], SHAPES[int(rng.integers(len(SHAPES)))]
    ans = "yes" if (col, shp) in shapes else "no"
    return "yesno", f"is there a {col} {shp} ?", ans, grid


def _img_cell(rng, n):
    if n not in (1, 2):
        return None
    grid = _random_grid(rng, int(rng.integers(1, MAX_SHAPES + 1)))
    filled = [i for i, c in enumerate(grid) if c is not None]
    empty = [i for i, c in enumerate(grid) if c is None]
    if n == 1 and rng.random() < 0.6:
        idx = filled[int(rng.integers(len(filled)))]
        if rng.random() < 0.5:
            return "cell_colour", f"what colour is the shape in the {_cell_name(idx)} ?", grid[idx][0], grid
        return "cell_shape", f"what shape is in the {_cell_name(idx)} ?", grid[idx][1], grid
    pool = empty if n == 1 else filled
    if not pool:
        return None
    idx = pool[int(rng.integers(len(pool)))]
    return "cell", f"what is in the {_cell_name(idx)} ?", _cell_words(grid[idx]), grid


def _img_repeat_colour(rng, n):
    """A long answer read from the image: the colour of one cell, repeated a given number of times."""
    if not 2 <= n <= 20:
        return None
    grid = _random_grid(rng, int(rng.integers(1, MAX_SHAPES + 1)))
    filled = [i for i, c in enumerate(grid) if c is not None]
    idx = filled[int(rng.integers(len(filled)))]
    question = f"repeat the colour of the shape in the {_cell_name(idx)} {NUMBERS[n]} times"
    return "repeat_colour", question, " ".join([grid[idx][0]] * n), grid


def _txt_repeat(rng, n):
    options = [w for w in (1, 2, 3) if n % w == 0 and 1 <= n // w <= 20]
    if not options:
        return None
    width = options[int(rng.integers(len(options)))]
    words = [NOUNS[int(rng.integers(len(NOUNS)))]]
    if width >= 2:
        words.insert(0, ADJECTIVES[int(rng.integers(len(ADJECTIVES)))])
    if width == 3:
        words.insert(1, COLOURS[int(rng.integers(len(COLOURS)))])
    phrase = " ".join(words)
    k = n // width
    return "repeat", f"repeat {phrase} {NUMBERS[k]} times", " ".join([phrase] * k), None


def _txt_count_to(rng, n):
    if not 1 <= n <= 20:
        return None
    return "count_to", f"count to {NUMBERS[n]}", " ".join(NUMBERS[1: n + 1]), None


def _txt_first_letters(rng, n):
    if not 1 <= n <= 20:
        return None
    return "first_letters", f"list the first {NUMBERS[n]} letters", " ".join(LETTERS[:n]), None


def _txt_next(rng, n):
    if n != 1:
        return None
    if rng.random() < 0.5:
        a = int(rng.integers(0, 20))
        return "after", f"what comes after {NUMBERS[a]} ?", NUMBERS[a + 1], None
    a = int(rng.integers(1, 21))
    return "before", f"what comes before {NUMBERS[a]} ?", NUMBERS[a - 1], None


# one-token answers are mostly read from the image
SHORT_FAMILIES = [_img_count] * 3 + [_img_yesno] * 2 + [_img_cell] * 3 + [_txt_next, _txt_count_to,
                                                                            _txt_first_letters]
LONG_FAMILIES = [_img_repeat_colour, _img_cell, _txt_repeat, _txt_count_to, _txt_first_letters]


def make_drill(rng: np.random.Generator) -> TaskRequest:
    """A training-only reading drill: list every cell's colour (or shape) in reading order.

    "list the colour of the shapes" -> 9 words, "nothing" for an empty cell. Nine answer words
    read from the image, each from one fixed image token, against one word for most image
    questions: it teaches the backbone to read the projected cells, as LLaVA's alignment stage
    teaches it on captions. Not part of any evaluation split.
    """
    grid = _random_grid(rng, int(rng.integers(1, MAX_SHAPES + 1)))
    if rng.random() < 0.5:
        kind, question, part = "list_colours", "list the colour of the shapes", 0
    else:
        kind, question, part = "list_shapes", "list the shapes", 1
    answer = " ".join("nothing" if c is None else c[part] for c in grid)
    return TaskRequest(kind, question, answer, draw_grid(grid, rng), grid)


def make_lookup_request(rng: np.random.Generator) -> TaskRequest:
    """A request from the families that must find one cell or one shape in the image: 50% "what
    colour / shape is in the <cell> ?" or "what is in the <cell> ?" (empty cell), 25% "what is in
    the <cell> ?" about a filled cell, 25% "is there a <colour> <shape> ?". Diagnostic only
    (``bench/embedded_lookup_lr.py``): no split or training mix draws from it.
    """
    while True:
        u = rng.random()
        out = _img_yesno(rng, 1) if u < 0.25 else _img_cell(rng, 2 if u < 0.5 else 1)
        if out is not None:
            kind, question, answer, grid = out
            return TaskRequest(kind, question, answer, draw_grid(grid, rng), grid)


def _target_length(rng: np.random.Generator) -> int:
    u = rng.random()
    if u < 0.30:
        return 1
    if u < 0.36:
        return 2
    while True:  # no family makes 23, 25 or 29 (a phrase of 1-3 words repeated at most twenty times)
        n = int(rng.integers(3, MAX_ANSWER_TOKENS + 1))
        if n not in (23, 25, 29):
            return n


def make_request(rng: np.random.Generator, *, image_focus: float = 0.0) -> TaskRequest:
    """One request drawn from ``rng``: a target answer length, then a family able to make it.

    image_focus: the probability of drawing from the image families only (training phases that
    practise reading the image; 0 = the standard mix, which every split uses).
    """
    if image_focus and rng.random() < image_focus:
        n = 1 if rng.random() < 0.6 else int(rng.integers(2, 21))
        families = [f for f in (SHORT_FAMILIES if n == 1 else LONG_FAMILIES) if f.__name__.startswith("_img")]
    else:
        n = _target_length(rng)
        families = SHORT_FAMILIES if n == 1 else LONG_FAMILIES
    for f in rng.permutation(len(families)):
        out = families[int(f)](rng, n)
        if out is not None:
            kind, question, answer, grid = out
            image = draw_grid(grid, rng) if grid is not None else None
            return TaskRequest(kind, question, answer, image, grid)
    raise AssertionError(f"no task family produces {n} answer tokens")  # _txt_repeat makes every n <= 30


def make_requests(n: int, split: str = "heldout", seed: int | None = None) -> list[TaskRequest]:
    """``n`` requests of ``split`` ("train" or "heldout"; the seeds differ), deterministic.

    ``seed`` overrides the split's seed (:data:`TRAIN_SEED` / :data:`HELDOUT_SEED`); the held-out
    split is drawn from a stream disjoint from any training seed below 1,000,000.
    """
    rng = split_rng(split, n, seed, train_seed=TRAIN_SEED, heldout_seed=HELDOUT_SEED)
    return [make_request(rng) for _ in range(n)]


def split_rng(split: str, n: int, seed: int | None, *, train_seed: int, heldout_seed: int) -> np.random.Generator:
    """The generator of a split's ``n`` requests (checked: ``split`` "train" or "heldout", ``n`` an
    int >= 0); ``seed`` None takes the split's own seed. Shared by the embedded models' tasks."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    if seed is None:
        seed = train_seed if split == "train" else heldout_seed
    return np.random.default_rng([seed, 0 if split == "train" else 1])


class RequestStream:
    """An endless deterministic stream of training requests (``next_batch(k)``).

    image_focus: see :func:`make_request`; drill: the probability of a reading drill
    (:func:`make_drill`) instead of a request.
    """

    def __init__(self, seed: int, *, image_focus: float = 0.0, drill: float = 0.0):
        self.rng = np.random.default_rng([seed, 0])
        self.image_focus = image_focus
        self.drill = drill

    def _one(self) -> TaskRequest:
        if self.drill and self.rng.random() < self.drill:
            return make_drill(self.rng)
        return make_request(self.rng, image_focus=self.image_focus)

    def next_batch(self, k: int) -> list[TaskRequest]:
        return [self._one() for _ in range(k)]
