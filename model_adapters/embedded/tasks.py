"""Deterministic tasks of the embedded demo model: drawn images with questions, and text tasks.

Every request is generated from a seed (``numpy.random.default_rng``), so a split is the same on
every machine. Answers are space-separated vocabulary words (one word = one token of the
word-level tokenizer), and their lengths are spread over 1 .. :data:`MAX_ANSWER_TOKENS` so that
truncating the fixed response window matters.

Images (48x48 px, one view): a 3x3 grid of 16 px cells, each empty or holding one coloured
shape (:data:`COLOURS` x :data:`SHAPES`), at most :data:`MAX_SHAPES` (6) shapes per image. With
the tower's 8 px patches a cell is 2x2 patches, and LaViDa's 2x2 bilinear pooling turns it into
exactly one LLM token (9 tokens + newline).

Question families (answer lengths in brackets):

==================  ===============================================  ==========================
image               "how many red shapes are there ?" -> "three"      1 (counts 0..6)
image               "how many circles are there ?" / "... shapes"     1
image               "is there a blue square ?" -> "yes" / "no"        1
image               "what colour is the shape in the top left ?"      1
image               "what is in the top left ?" -> "green circle"     1-2 ("nothing")
image               "list the colours" -> "red blue red"              1-6
image               "list the red shapes" -> "circle , square"        1-11 (2k-1)
image               "where is the red circle ?" -> "top left , ..."   1-11 (3k-1)
image               "describe the top row" -> "red circle , nothing , blue square"  5-8
image               "list the shapes" -> "red circle , blue square"   1-17 (3n-1)
image               "name the shapes" -> "red circle blue square"    2-12 (2n)
image               "describe the grid" -> 9 cells, comma separated    17-23
text                "count from three to nine" / "count down from ..."  2-21
text                "repeat apple four times" / "repeat big red apple two times"  1-30
text                "spell elephant" -> "e l e p h a n t"             3-10
text                "list the letters from c to k" -> "c d e ... k"   1-26
text                "what is two plus three ?" / "what comes after seven ?"  1
==================  ===============================================  ==========================

A request is made by drawing a target answer length first (:func:`_target_length`: 20% one
token, 6% two tokens, the rest uniform over 3..30 except 29, which no family makes), then a
family able to produce it.
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
SPELL_WORDS = sorted(set(NOUNS + COLOURS + SHAPES + ["nothing", "yes", "seven", "three", "eleven"]))
OTHER_WORDS = ["how", "many", "shapes", "are", "there", "is", "a", "what", "in", "the", "colour", "of",
               "shape", "list", "describe", "row", "grid", "where", "count", "from", "to", "down", "repeat",
               "times", "spell", "letters", "plus", "comes", "after", "before", "nothing", "nowhere", "yes",
               "no", "colours", "name", "?", ",", "user", "assistant", "system"]


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
MAX_SHAPES = 6  # shapes per image: whole-grid lists stay within what a tiny model reads exactly
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
# None when it cannot produce that length.
def _img_count(rng, n):
    if n != 1:
        return None
    grid = _random_grid(rng, int(rng.integers(0, MAX_SHAPES + 1)))
    shapes = [c for c in grid if c is not None]
    mode = int(rng.integers(4))
    if mode == 0:
        col = COLOURS[int(rng.integers(len(COLOURS)))]
        k = sum(c[0] == col for c in shapes)
        return "count_colour", f"how many {col} shapes are there ?", NUMBERS[k], grid
    if mode == 1:
        shp = SHAPES[int(rng.integers(len(SHAPES)))]
        k = sum(c[1] == shp for c in shapes)
        return "count_shape", f"how many {PLURAL[shp]} are there ?", NUMBERS[k], grid
    if mode == 2:
        return "count_all", "how many shapes are there ?", NUMBERS[len(shapes)], grid
    col, shp = COLOURS[int(rng.integers(len(COLOURS)))], SHAPES[int(rng.integers(len(SHAPES)))]
    k = sum(c == (col, shp) for c in shapes)
    return "count_kind", f"how many {col} {PLURAL[shp]} are there ?", NUMBERS[k], grid


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
    if n == 1 and rng.random() < 0.5 and filled:
        idx = filled[int(rng.integers(len(filled)))]
        if rng.random() < 0.5:
            return "cell_colour", f"what colour is the shape in the {_cell_name(idx)} ?", grid[idx][0], grid
        return "cell_shape", f"what shape is in the {_cell_name(idx)} ?", grid[idx][1], grid
    pool = empty if n == 1 else filled
    if not pool:
        return None
    idx = pool[int(rng.integers(len(pool)))]
    return "cell", f"what is in the {_cell_name(idx)} ?", _cell_words(grid[idx]), grid


def _img_list_colours(rng, n):
    if n > MAX_SHAPES:
        return None
    k = 0 if (n == 1 and rng.random() < 0.2) else n
    grid = _random_grid(rng, k)
    ans = " ".join(c[0] for c in grid if c is not None) or "nothing"
    return "list_colours", "list the colours", ans, grid


def _img_list_of_colour(rng, n):
    if n % 2 == 0 or (n + 1) // 2 > MAX_SHAPES:
        return None
    col = COLOURS[int(rng.integers(len(COLOURS)))]
    k = 0 if (n == 1 and rng.random() < 0.3) else (n + 1) // 2
    others = [c for c in COLOURS if c != col]
    rest = int(rng.integers(0, MAX_SHAPES - k + 1))
    cells = rng.permutation(9)
    grid: list = [None] * 9
    for j, idx in enumerate(cells[: k + rest]):
        colour = col if j < k else others[int(rng.integers(len(others)))]
        grid[int(idx)] = (colour, SHAPES[int(rng.integers(len(SHAPES)))])
    ans = _join([c[1] for c in grid if c is not None and c[0] == col])
    return "list_of_colour", f"list the {col} shapes", ans, grid


def _img_where(rng, n):
    if n % 3 != 2 and n != 1:
        return None
    k = 0 if n == 1 else (n + 1) // 3
    if k > 4:
        return None
    col, shp = COLOURS[int(rng.integers(len(COLOURS)))], SHAPES[int(rng.integers(len(SHAPES)))]
    rest = int(rng.integers(0, MAX_SHAPES - k + 1))
    cells = rng.permutation(9)
    grid: list = [None] * 9
    for j, idx in enumerate(cells[: k + rest]):
        if j < k:
            grid[int(idx)] = (col, shp)
        else:
            while True:
                cand = (COLOURS[int(rng.integers(len(COLOURS)))], SHAPES[int(rng.integers(len(SHAPES)))])
                if cand != (col, shp):
                    break
            grid[int(idx)] = cand
    places = [_cell_name(i) for i, c in enumerate(grid) if c == (col, shp)]
    ans = " , ".join(places) if places else "nowhere"
    return "where", f"where is the {col} {shp} ?", ans, grid


def _img_describe_row(rng, n):
    if not 5 <= n <= 8:
        return None
    m = n - 5  # shapes in that row
    r = int(rng.integers(3))
    grid = _random_grid(rng, int(rng.integers(0, MAX_SHAPES - 3 + 1)))
    for c in range(3):
        grid[r * 3 + c] = None
    for c in rng.choice(3, size=m, replace=False):
        colour = COLOURS[int(rng.integers(len(COLOURS)))]
        grid[r * 3 + int(c)] = (colour, SHAPES[int(rng.integers(len(SHAPES)))])
    ans = " , ".join(_cell_words(grid[r * 3 + c]) for c in range(3))
    return "describe_row", f"describe the {ROWS[r]} row", ans, grid


def _img_list_shapes(rng, n):
    if n % 3 != 2 and n != 1:
        return None
    k = 0 if n == 1 else (n + 1) // 3
    if k > MAX_SHAPES:
        return None
    grid = _random_grid(rng, k)
    ans = _join([_cell_words(c) for c in grid if c is not None])
    return "list_shapes", "list the shapes", ans, grid


def _img_name_shapes(rng, n):
    if n % 2 or not 2 <= n <= 2 * MAX_SHAPES:
        return None
    grid = _random_grid(rng, n // 2)
    return "name_shapes", "name the shapes", " ".join(_cell_words(c) for c in grid if c is not None), grid


def _img_describe_grid(rng, n):
    if not 17 <= n <= 17 + MAX_SHAPES:
        return None
    grid = _random_grid(rng, n - 17)
    return "describe_grid", "describe the grid", " , ".join(_cell_words(c) for c in grid), grid


def _txt_count(rng, n):
    if not 2 <= n <= 21:
        return None
    a = int(rng.integers(0, 21 - n + 1))
    b = a + n - 1
    if rng.random() < 0.5:
        return "count_up", f"count from {NUMBERS[a]} to {NUMBERS[b]}", " ".join(NUMBERS[a: b + 1]), None
    return ("count_down", f"count down from {NUMBERS[b]} to {NUMBERS[a]}",
            " ".join(reversed(NUMBERS[a: b + 1])), None)


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


def _txt_spell(rng, n):
    words = [w for w in SPELL_WORDS if len(w) == n]
    if not words:
        return None
    w = words[int(rng.integers(len(words)))]
    return "spell", f"spell {w}", " ".join(w), None


def _txt_letters(rng, n):
    if not 1 <= n <= 26:
        return None
    a = int(rng.integers(0, 26 - n + 1))
    question = f"list the letters from {LETTERS[a]} to {LETTERS[a + n - 1]}"
    return "letters", question, " ".join(LETTERS[a: a + n]), None


def _txt_arith(rng, n):
    if n != 1:
        return None
    mode = int(rng.integers(3))
    if mode == 0:
        s = int(rng.integers(0, 21))
        a = int(rng.integers(0, s + 1))
        return "plus", f"what is {NUMBERS[a]} plus {NUMBERS[s - a]} ?", NUMBERS[s], None
    if mode == 1:
        a = int(rng.integers(0, 20))
        return "after", f"what comes after {NUMBERS[a]} ?", NUMBERS[a + 1], None
    a = int(rng.integers(1, 21))
    return "before", f"what comes before {NUMBERS[a]} ?", NUMBERS[a - 1], None


IMAGE_FAMILIES = [_img_count, _img_yesno, _img_cell, _img_list_colours, _img_list_of_colour, _img_where,
                  _img_describe_row, _img_list_shapes, _img_name_shapes, _img_describe_grid]
# one-token image answers: counting and yes/no get most of the share (they are the hardest)
ONE_TOKEN_IMAGE = ([_img_count] * 7 + [_img_yesno] * 5 + [_img_cell] * 4
                   + [_img_list_colours, _img_list_of_colour, _img_where, _img_list_shapes])
TEXT_FAMILIES = [_txt_count, _txt_repeat, _txt_spell, _txt_letters, _txt_arith]


def _target_length(rng: np.random.Generator) -> int:
    u = rng.random()
    if u < 0.20:
        return 1
    if u < 0.26:
        return 2
    while True:  # 29 is prime and above every single-family range: no family makes it
        n = int(rng.integers(3, MAX_ANSWER_TOKENS + 1))
        if n != 29:
            return n


def make_request(rng: np.random.Generator, *, image_fraction: float = 0.55) -> TaskRequest:
    """One request drawn from ``rng``: a target length, then image (``image_fraction``) or text
    families in random order until one can produce that length (the other modality if none can)."""
    n = _target_length(rng)
    use_image = rng.random() < image_fraction
    image_families = ONE_TOKEN_IMAGE if n == 1 else IMAGE_FAMILIES
    groups = [image_families, TEXT_FAMILIES] if use_image else [TEXT_FAMILIES, image_families]
    for families in groups:
        for f in rng.permutation(len(families)):
            out = families[int(f)](rng, n)
            if out is not None:
                kind, question, answer, grid = out
                image = draw_grid(grid, rng) if grid is not None else None
                return TaskRequest(kind, question, answer, image, grid)
    raise AssertionError(f"no task family produces {n} answer tokens")  # every n in 1..30 has one


def make_requests(n: int, split: str = "heldout", seed: int | None = None) -> list[TaskRequest]:
    """``n`` requests of ``split`` ("train" or "heldout"; the seeds differ), deterministic.

    ``seed`` overrides the split's seed (:data:`TRAIN_SEED` / :data:`HELDOUT_SEED`); the held-out
    split is drawn from a stream disjoint from any training seed below 1,000,000.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if seed is None:
        seed = TRAIN_SEED if split == "train" else HELDOUT_SEED
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    return [make_request(rng) for _ in range(n)]


class RequestStream:
    """An endless deterministic stream of training requests (``next_batch(k)``)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng([seed, 0])

    def next_batch(self, k: int) -> list[TaskRequest]:
        return [make_request(self.rng) for _ in range(k)]
