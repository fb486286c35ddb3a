"""Sharded, resumable batch inference over a JSONL file of requests: what ``seer run`` does, and
what the Ray Data predictor (``seer_runtime.ray_data.SeerPredictor``) runs per batch. The harness
adapters share its data-parallel set-up (:func:`init_data_parallel`) and request seeds
(:func:`request_seed`).

Input: one JSON object per line (an empty line is an error: every line is one request)::

    {"prompt": "count to four", "image": "pics/1.png", "options": {"gen_length": 64}, "id": "q17"}

``prompt`` (required) is rendered with the checkpoint's chat template for one user turn, as
``seer generate`` does; ``image`` (optional) is a path relative to the input file's folder;
``options`` (optional) are GenerationConfig fields over the run's; ``id`` (optional, any JSON
value) is copied to the answer. Any other key is an error naming the line.

Output: one JSON object per input line, in input order (:data:`RECORD_KEYS`): ``line`` (the
input's line number), ``id`` (when given), ``answer`` (text before the first end token),
``answer_tokens``, ``complete`` (an end token was found inside the window), ``steps``,
``positions_computed`` (the request's own positions x layers, summed over its forwards), ``seed``
and, with Seer, ``window`` (the window length after Seer's cut and guard). Each holds only what
the request's own decoding decides: the same bytes whatever the batch, shard or resumption.
Timings are the run's, printed at the end (tokens and NFE summed over ranks, the slowest rank's
decode time).

Sharding and resumption: launched under ``torchrun`` / ``accelerate launch`` (RANK, WORLD_SIZE,
LOCAL_RANK), rank r decodes every world_size-th request that no part file holds yet, from the
r-th on (all ranks read the part files before any writes, and check that they saw the same). Every
rank appends its answers to its own part file, ``<output>.parts/rank-R-of-W.jsonl``, flushed
and fsynced after every batch; a part file starts with the run's settings (:meth:`BatchDecoder.
fingerprint`) and every answer carries a digest of its input line. A run started again on the
same output (after a kill, and with any number of ranks) reads every part file first and decodes
only what none holds (a partly written last line is dropped and rewritten); other settings, or an
input line changed since, are errors naming the file. When every rank is done, rank 0 merges the
parts in input order, checks that every input line is there exactly once, writes the output to a
temporary file renamed into place (atomic) and removes the parts.

Seeds: every request draws from its own generator (``rng="per_request"``) seeded from its
content (:func:`request_seed`: the prompt, the image path and the configured ``seed``), so that
a sampled answer does not depend on the batch, shard or resumption (``rng="global"`` cannot be
honoured here and is refused).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .config import MAX_SEED, GenerationConfig
from .evaluate import pad_left
from .files import atomic_write, check_output_path
from .generation import check_sequence_length, generate
from .request_files import RUN_REQUEST, check_line, read_jsonl

#: the keys an input line may hold
#: the keys of an answer record, in the order they are written (``id`` and ``window`` when present)
RECORD_KEYS = ("line", "id", "answer", "answer_tokens", "complete", "steps", "positions_computed", "seed", "window")
#: how long a rank waits in a collective for the others (seconds) unless told otherwise
DEFAULT_DIST_TIMEOUT_S = 3600.0
#: the version of the part-file layout (its header says it)
PART_FORMAT = 1


# ------------------------------------------------------------------------------------ data parallel
@dataclass(frozen=True)
class Ranks:
    """This process's place among the launcher's: the global ``rank``, ``world_size`` and the
    ``local_rank`` on this node (the GPU it uses)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls, environ: dict | None = None) -> Ranks:
        """RANK, WORLD_SIZE and LOCAL_RANK as ``torchrun`` and ``accelerate launch`` set them (one
        process when WORLD_SIZE is unset); a missing or malformed one is a ``ValueError`` naming it."""
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" not in env:
            return cls()

        def read(name: str, default: int | None) -> int:
            text = env.get(name)
            if text is None:
                if default is None:
                    raise ValueError(f"WORLD_SIZE is {env['WORLD_SIZE']} but {name} is not set: start the processes "
                                     "with torchrun or accelerate launch")
                return default
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"the environment variable {name} must be an int, got {text!r}") from None

        world = read("WORLD_SIZE", None)
        if world < 1:
            raise ValueError(f"the environment variable WORLD_SIZE must be >= 1, got {world}")
        single = 0 if world == 1 else None
        rank, local = read("RANK", single), read("LOCAL_RANK", single)
        if not 0 <= rank < world:
            raise ValueError(f"the environment variable RANK must be in [0, WORLD_SIZE={world}), got {rank}")
        if local < 0:
            raise ValueError(f"the environment variable LOCAL_RANK must be >= 0, got {local}")
        return cls(rank, world, local)


def init_data_parallel(device: str | torch.device = "cpu", *, timeout_s: float = DEFAULT_DIST_TIMEOUT_S,
                       environ: dict | None = None) -> tuple[Ranks, torch.device]:
    """This process's ranks and device, joining the launcher's process group when there are several.

    device: "cpu", or "cuda" / "cuda:N". With several processes every rank uses cuda:LOCAL_RANK
        (an index given is replaced, with a warning, as lm-eval's HF model does); alone, "cuda"
        means cuda:LOCAL_RANK (0 unless a launcher set it).
    timeout_s: how long a collective waits for the other ranks before it fails (a dead or stuck
        rank ends the run with an error instead of a hang).

    The process group (NCCL on CUDA, gloo on CPU) is created from the launcher's environment
    (``env://``) unless one exists; an existing group must agree with RANK and WORLD_SIZE.
    """
    ranks = Ranks.from_environment(environ)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r}, but CUDA is not available here: pass --device cpu")
        if dev.index is not None and ranks.world_size > 1 and dev.index != ranks.local_rank:
            warnings.warn(f"device={str(device)!r} under a launcher of {ranks.world_size} processes: rank "
                          f"{ranks.rank} uses cuda:{ranks.local_rank} (its LOCAL_RANK)", UserWarning, stacklevel=2)
        if dev.index is None or ranks.world_size > 1:
            dev = torch.device("cuda", ranks.local_rank)
        count = torch.cuda.device_count()
        if dev.index >= count:
            raise ValueError(f"rank {ranks.rank} wants cuda:{dev.index} (LOCAL_RANK {ranks.local_rank}) but this "
                             f"machine has {count} CUDA device(s): start at most {count} processes per machine")
        torch.cuda.set_device(dev)
    elif dev.type != "cpu":
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    if ranks.world_size > 1:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"the collective timeout must be a number of seconds > 0, got {timeout_s!r}")
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo",
                                    timeout=timedelta(seconds=float(timeout_s)))
            # the group we made is torn down before the interpreter's own teardown: left to it, gloo's
            # threads can die with the process and abort it ("terminate called without an active
            # exception", exit -6) after every result was written
            atexit.register(_destroy_process_group)
        if (dist.get_rank(), dist.get_world_size()) != (ranks.rank, ranks.world_size):
            raise RuntimeError(f"the process group has rank {dist.get_rank()} of {dist.get_world_size()}, the "
                               f"environment says RANK={ranks.rank} WORLD_SIZE={ranks.world_size}")
    return ranks, dev


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather_objects(obj, ranks: Ranks) -> list:
    """``obj`` of every rank, in rank order, on every rank (``[obj]`` alone). A collective: every
    rank must call it."""
    if ranks.world_size == 1:
        return [obj]
    import torch.distributed as dist

    gathered = [None] * ranks.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


# ------------------------------------------------------------------------------------- seeds
def request_seed(seed: int | None, prompt: str | Sequence[int], *, images: Sequence[str] = (), sample: int = 0) -> int:
    """A request's generator seed from its content, in [0, 2**62): BLAKE2b of the configured
    ``seed`` (None counts as 0), the ``prompt`` (its text, or ids), the ``images``' identities
    (paths as given, or content digests) and the ``sample`` index (0; the k-th repeat of a
    request asks for k). Stable across processes, machines and Python versions (no ``hash()``)."""
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(f"sample must be an int >= 0, got {sample!r}")
    if not isinstance(prompt, str):
        prompt = [int(t) for t in prompt]
    payload = json.dumps([0 if seed is None else int(seed), prompt, [str(i) for i in images], sample],
                         ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.blake2b(payload.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % MAX_SEED


def line_digest(text: str) -> str:
    """A short digest of an input line (what an answer in a part file was computed from)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).hexdigest()


# -------------------------------------------------------------------------------------- input
@dataclass(frozen=True)
class RunRequest:
    """One request: its ``index`` among the requests (0-based), ``line`` in its file (1-based),
    ``prompt``, ``image`` (a resolved path, or None), ``image_key`` (the path as written: part of
    the seed), ``options`` (GenerationConfig fields), ``meta`` (the keys copied to its answer:
    ``id``) and ``digest`` (of the line's text)."""

    index: int
    line: int
    prompt: str
    image: Path | None = None
    image_key: str | None = None
    options: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    digest: str = ""
    source: str = "request"


def run_request(item: dict, *, index: int, line: int, where: str, folder: Path | None, text: str = "") -> RunRequest:
    """A :class:`RunRequest` from one request's JSON object, checked against
    ``request_files.RUN_REQUEST`` (``where`` starts its errors; an image path is relative to
    ``folder``); ``text``: the line as written (its digest guards a resume)."""
    values = check_line(item, RUN_REQUEST, where, folder if folder is not None else Path.cwd())
    meta = {"id": item["id"]} if "id" in item else {}
    return RunRequest(index, line, values["prompt"], values.get("image"), item.get("image"),
                      dict(values.get("options") or {}), meta, line_digest(text), where)


def read_run_requests(path: str | Path) -> list[RunRequest]:
    """Every request of the JSONL file ``path`` (module docstring), each line checked against
    ``request_files.RUN_REQUEST`` before anything is decoded: a bad line is a ``ValueError`` naming
    the file and line."""
    path = Path(path)
    return [run_request(line.item, index=i, line=line.line, where=f"--input {path}:{line.line}", folder=path.parent,
                        text=line.text) for i, line in enumerate(read_jsonl(path, RUN_REQUEST, what="--input"))]


# ------------------------------------------------------------------------------------- decoding
@dataclass
class Speed:
    """What a rank decoded: answer tokens, forward passes (summed over batches), requests, the
    seconds spent in ``generate`` and the work (``GenerationStats.positions_computed``: positions x
    layers, DyLLM's reused rows not counted). The harnesses' ``Speed`` adds a field; ``add`` and
    ``combined`` treat every field alike."""

    tokens: int = 0
    nfe: int = 0
    requests: int = 0
    wall_s: float = 0.0
    positions_computed: int = 0

    def add(self, other: Speed) -> None:
        """``other``'s figures after this one's, on the same rank: everything added, the time too."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @classmethod
    def combined(cls, parts: Sequence[Speed]) -> Speed:
        """Ranks' figures together: counts added, the wall time of the slowest rank."""
        total = cls()
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            setattr(total, f.name, max(values, default=0.0) if f.name == "wall_s" else sum(values))
        return total

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class Prepared:
    """A request ready to decode: its prompt ids, GenerationConfig, seed and batching group."""

    request: RunRequest
    prompt_ids: list[int]
    gen: GenerationConfig
    group: str
    seed: int


class BatchDecoder:
    """A loaded checkpoint with its chat template and decoding settings, decoding requests in
    batches: what one ``seer run`` rank or one Ray actor holds.

    gen: the run's GenerationConfig (``rng`` must be "per_request": every request is seeded from
        its content); a request's ``options`` apply over it.
    seer / dyllm: the policies every request is decoded with (None: off).
    batch_size: requests per ``generate`` call (requests with equal options are batched together).
    load_image: ``load_image(model, path)`` (the model layer's).
    """

    def __init__(self, model, tokenizer, *, gen: GenerationConfig, seer=None, dyllm=None, batch_size: int = 16,
                 load_image: Callable | None = None, source: dict | None = None):
        if not isinstance(gen, GenerationConfig):
            raise TypeError(f"gen must be a GenerationConfig, got {type(gen).__name__}")
        if gen.rng != "per_request":
            raise ValueError(f"rng={gen.rng!r}: batch inference seeds every request from its content (rng="
                             "'per_request'); the global generator's draws depend on the batch and the shard")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.model, self.tokenizer, self.gen = model, tokenizer, gen
        self.seer, self.dyllm, self.batch_size = seer, dyllm, batch_size
        self.load_image = load_image
        self.source = dict(source or {})
        self._configs: dict[str, GenerationConfig] = {}

    @classmethod
    def load(cls, model_dir: str | Path, *, generation: dict | None = None, seer: str | None = None,
             dyllm: str | None = None, chat_template: str | None = None, dtype: str | None = None,
             device: str | torch.device = "cpu", batch_size: int = 16) -> BatchDecoder:
        """Load ``model_dir`` through the model layer: its template (or ``chat_template``), its
        decoding defaults (``seer_generation_config.json``) with ``generation`` over them, ``seer``
        (a SeerConfig file) and ``dyllm`` (a DyLLMConfig file or "default")."""
        from types import SimpleNamespace

        from .cli.options import DTYPES, checkpoint_generation_fields, model_services, policies

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {[k for k in DTYPES if k]}, got {dtype!r}")
        fields = {**checkpoint_generation_fields(model_dir), **(generation or {})}
        gen = run_generation_config(fields, where="the generation settings")
        svc = model_services()
        tokenizer = svc.load_tokenizer(model_dir, chat_template=chat_template)
        model = svc.load_model(model_dir, dtype=DTYPES[dtype], device=device)
        seer_cfg, dyllm_cfg = policies(SimpleNamespace(seer=seer, dyllm=dyllm), model)
        source = {"model": str(Path(model_dir).resolve()), "dtype": dtype,
                  "chat_template": tokenizer.template.source if tokenizer.template else None}
        return cls(model, tokenizer, gen=gen, seer=seer_cfg, dyllm=dyllm_cfg, batch_size=batch_size,
                   load_image=svc.load_image, source=source)

    def fingerprint(self) -> dict:
        """The settings an answer depends on (a part file's header: a resumed run must match)."""
        return {**self.source, "generation": self.gen.to_dict(),
                "seer": None if self.seer is None else self.seer.to_dict(),
                "dyllm": None if self.dyllm is None else self.dyllm.to_dict()}

    def request_config(self, options: dict, where: str) -> GenerationConfig:
        """The run's GenerationConfig with a request's ``options`` over it (cached per options)."""
        key = json.dumps(options, sort_keys=True)
        if key not in self._configs:
            fields = self.gen.to_dict()
            if "threshold" in options and "steps" not in options:
                fields["steps"] = None  # a threshold decides the steps (as the command line's --threshold)
            self._configs[key] = run_generation_config({**fields, **options}, where=f"{where}: options")
        return self._configs[key]

    def prepare(self, requests: Sequence[RunRequest]) -> list[Prepared]:
        """Encode and check every request before any is decoded: a ``ValueError`` names the first
        bad one (its options, an image for a text-only model, a prompt too long for the model)."""
        multimodal = bool(getattr(self.model, "is_multimodal", False))
        prepared = []
        for req in requests:
            gen = self.request_config(req.options, req.source)
            if req.image is not None and not multimodal:
                raise ValueError(f"{req.source}: an image was given, but {type(self.model).__name__} is a text-only "
                                 "model")
            ids = self.tokenizer.encode_prompt(req.prompt, with_image=req.image is not None)
            try:
                check_sequence_length(self.model, len(ids), gen, images_counted=req.image is None)
            except ValueError as exc:
                raise ValueError(f"{req.source}: {exc}") from None
            seed = request_seed(gen.seed, req.prompt, images=[req.image_key] if req.image_key else ())
            prepared.append(Prepared(req, ids, gen, json.dumps(req.options, sort_keys=True), seed))
        return prepared

    def batches(self, prepared: Sequence[Prepared]) -> Iterator[list[Prepared]]:
        """``prepared`` in batches of ``batch_size``: requests with equal options together, groups in
        the order they first appear, requests in order within a group."""
        groups: dict[str, list[Prepared]] = {}
        for p in prepared:
            groups.setdefault(p.group, []).append(p)
        for rows in groups.values():
            for start in range(0, len(rows), self.batch_size):
                yield rows[start: start + self.batch_size]

    def decode_batch(self, batch: Sequence[Prepared]) -> tuple[list[dict], Speed]:
        """The answer records of one batch (:data:`RECORD_KEYS`, in its order) and its figures."""
        model = self.model
        ids, mask = pad_left([p.prompt_ids for p in batch], model.token_ids.pad)
        images = None
        if getattr(model, "is_multimodal", False):
            images = []
            for p in batch:
                if p.request.image is None:
                    images.append(None)
                    continue
                try:
                    images.append(self.load_image(model, p.request.image))
                except Exception as exc:  # an unreadable file: name the request, keep the cause
                    raise ValueError(f"{p.request.source}: image {p.request.image}: {exc}") from exc
        t0 = time.perf_counter()
        out = generate(model, ids.to(model.device), attention_mask=None if mask is None else mask.to(model.device),
                       images=images, gen=batch[0].gen, seer=self.seer, dyllm=self.dyllm,
                       request_seeds=[p.seed for p in batch])
        if out.sequences.is_cuda:  # the time of the work, not of its launch
            torch.cuda.synchronize(out.sequences.device)
        wall = time.perf_counter() - t0
        st = out.stats
        windows = st.extra["seer"]["final_window"] if "seer" in st.extra else None
        records, tokens = [], 0
        for r, p in enumerate(batch):
            answer = out.answer_ids(r)
            tokens += len(answer)
            record = {"line": p.request.line, **p.request.meta, "answer": self.tokenizer.decode(answer),
                      "answer_tokens": len(answer), "complete": int(out.end_positions[r]) >= 0,
                      "steps": int(st.steps[r]), "positions_computed": int(st.positions_computed_per_request[r]),
                      "seed": p.seed}
            if windows is not None:
                record["window"] = int(windows[r])
            records.append(record)
        return records, Speed(tokens, st.nfe, len(batch), wall, st.positions_computed)

    def decode(self, prepared: Sequence[Prepared]) -> tuple[list[dict], Speed]:
        """Every request's record, in the order of ``prepared``, and the figures of all batches."""
        by_index, parts = {}, []
        for batch in self.batches(prepared):
            records, speed = self.decode_batch(batch)
            parts.append(speed)
            for p, record in zip(batch, records):
                by_index[id(p)] = record
        total = Speed()
        for speed in parts:  # batches one after another: their times add up
            total.add(speed)
        return [by_index[id(p)] for p in prepared], total


def run_generation_config(fields: dict, *, where: str) -> GenerationConfig:
    """``fields`` as the GenerationConfig batch inference decodes with: ``rng`` "per_request" (an
    explicit "global" is an error naming ``where``)."""
    if fields.get("rng", "per_request") != "per_request":
        raise ValueError(f"{where}: rng={fields['rng']!r} is not supported: every request is seeded from its "
                         "content (rng='per_request'), so that its answer does not depend on its batch or shard")
    try:
        return GenerationConfig.from_dict({**fields, "rng": "per_request"})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


# ----------------------------------------------------------------------------------- part files
def parts_folder(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def part_path(output: Path, ranks: Ranks) -> Path:
    return parts_folder(output) / f"rank-{ranks.rank:05d}-of-{ranks.world_size:05d}.jsonl"


def complete_prefix(data: bytes) -> bytes:
    """The bytes of ``data`` up to its last newline (a last line without one was cut by a kill)."""
    return data[: data.rfind(b"\n") + 1]


def read_parts(output: Path, requests: Sequence[RunRequest], fingerprint: dict) -> dict[int, list[tuple[str, str]]]:
    """Every answer the part files of ``output`` hold: input line -> [(serialised record, part file)].

    Checks each file's header against ``fingerprint`` and each answer's input digest against the
    request of its line (``ValueError`` naming the file); a last line cut by a kill is skipped."""
    folder = parts_folder(output)
    by_line = {r.line: r for r in requests}
    found: dict[int, list[tuple[str, str]]] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("rank-*-of-*.jsonl")):
        lines = complete_prefix(path.read_bytes()).decode("utf-8").splitlines()
        if not lines:
            continue
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("seer_run_part") != PART_FORMAT:
            raise ValueError(f"{path}:1: not a seer run part file (remove {folder} to start over)")
        if header.get("run") != fingerprint:
            theirs = header.get("run") or {}
            changed = sorted(k for k in set(theirs) | set(fingerprint) if theirs.get(k) != fingerprint.get(k))
            raise ValueError(f"{path} was written with other settings ({', '.join(changed)} differ): resume with "
                             f"the same ones, or remove {folder} to start over")
        for number, text in enumerate(lines[1:], 2):
            try:
                item = json.loads(text)
                line, digest, record = item["line"], item["input"], item["record"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{path}:{number}: not an answer record (remove {folder} to start over)") from None
            request = by_line.get(line)
            if request is None or request.digest != digest:
                raise ValueError(f"{path}:{number}: input line {line} changed since this answer was written: "
                                 f"resume with the same input, or remove {folder} to start over")
            found.setdefault(line, []).append((json.dumps(record, ensure_ascii=False), str(path)))
    return found


class PartWriter:
    """This rank's part file, opened for appending: a cut last line is dropped first, and a new
    file starts with the header. :meth:`write` flushes and fsyncs (one call per batch)."""

    def __init__(self, path: Path, fingerprint: dict):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        keep = len(complete_prefix(path.read_bytes())) if path.exists() else 0
        self.file = open(path, "ab")
        self.file.truncate(keep)
        if keep == 0:
            self._write([{"seer_run_part": PART_FORMAT, "run": fingerprint}])

    def _write(self, items: list[dict]) -> None:
        self.file.write(b"".join((json.dumps(i, ensure_ascii=False) + "\n").encode("utf-8") for i in items))
        self.file.flush()
        os.fsync(self.file.fileno())

    def write(self, requests: Sequence[RunRequest], records: Sequence[dict]) -> None:
        self._write([{"line": q.line, "input": q.digest, "record": r} for q, r in zip(requests, records)])

    def close(self) -> None:
        self.file.close()


def merge_parts(output: Path, requests: Sequence[RunRequest], fingerprint: dict) -> int:
    """Write ``output`` from the part files: one answer per input line, in input order, atomically;
    then remove the parts. Returns how many answers were held twice (identical, written once); a
    line missing or held twice with different answers is a ``RuntimeError`` (nothing is removed)."""
    found = read_parts(output, requests, fingerprint)
    missing = [r.line for r in requests if r.line not in found]
    if missing:
        raise RuntimeError(f"the part files in {parts_folder(output)} hold no answer for input lines {missing[:10]}"
                           f"{' ...' if len(missing) > 10 else ''}: run the same command again to decode them")
    duplicates = 0
    for line, copies in found.items():
        if len({text for text, _ in copies}) > 1:
            raise RuntimeError(f"input line {line} has different answers in {sorted({p for _, p in copies})}")
        duplicates += len(copies) - 1
    with atomic_write(output) as f:
        for r in requests:
            f.write(found[r.line][0][0] + "\n")
    folder = parts_folder(output)
    for path in folder.glob("rank-*-of-*.jsonl"):
        path.unlink()
    folder.rmdir()
    return duplicates


# ------------------------------------------------------------------------------------- the run
@dataclass
class RunSummary:
    """What one ``run_file`` call did: ``requests`` in the input, ``resumed`` (answers found in
    part files from earlier runs), this launch's ``speed`` (all ranks), ``duplicates`` merged."""

    requests: int
    resumed: int
    speed: Speed
    duplicates: int = 0
    ranks: Ranks = field(default_factory=Ranks)


def check_output(input_path: Path, output: Path, *, overwrite: bool) -> None:
    """The output path before any work (``files.check_output_path``: a writable file path, its
    folder made when missing): not the input, and not an existing file unless ``overwrite`` (or
    unfinished parts of it are there to resume)."""
    if output.resolve() == input_path.resolve():
        raise ValueError(f"--output {output} is the input file")
    check_output_path(output, option="--output")
    if output.exists() and not overwrite and not parts_folder(output).is_dir():
        raise ValueError(f"--output {output} exists: pass --overwrite to replace it")


def _this_ranks_share(decoder: BatchDecoder, requests: Sequence[RunRequest], output: Path, fingerprint: dict,
                      ranks: Ranks) -> tuple[dict, list[Prepared]]:
    """The answers the part files of ``output`` already hold and this rank's share of the rest,
    prepared. Every rank reads and prepares before any decodes, and all agree: an error on any
    rank is raised on every rank; ranks that read different parts raise ``RuntimeError``."""
    error, prepared, done = None, [], {}
    try:
        done = read_parts(output, requests, fingerprint)
        # the rest shared evenly (after a resume the earlier shares may be far from even)
        mine = [r for r in requests if r.line not in done][ranks.rank::ranks.world_size]
        prepared = decoder.prepare(mine)
    except ValueError as exc:
        error = str(exc)
    seen = line_digest(json.dumps(sorted(done)))
    gathered = all_gather_objects((error, seen), ranks)  # every read happens before this, every write after
    errors = [e for e, _ in gathered if e is not None]
    if errors:
        raise ValueError(errors[0])
    if len({d for _, d in gathered}) > 1:
        raise RuntimeError(f"the ranks read different answers from {parts_folder(output)} (is another run writing "
                           "there?): nothing was decoded")
    return done, prepared


def run_file(decoder: BatchDecoder, input_path: str | Path, output: str | Path, *, ranks: Ranks | None = None,
             requests: Sequence[RunRequest] | None = None, overwrite: bool = False,
             progress: bool = True, command=None) -> RunSummary:
    """Decode every request of ``input_path`` not already in the part files of ``output`` (this
    rank's share of them), then, on rank 0, merge the parts into ``output`` (module docstring).

    requests: ``read_run_requests(input_path)`` when the caller has read them already (before
        loading the model, so that a bad line is named before long work).
    command: the command line's progress (``cli.progress.CommandProgress``): what an interrupt
        says was done and written (this rank's part file, where a run started again resumes).
    Every rank reads and checks every input line, and prepares its share, before any rank decodes:
    a bad line anywhere stops every rank with the same error."""
    ranks = ranks or Ranks()
    input_path, output = Path(input_path), Path(output)
    requests = read_run_requests(input_path) if requests is None else list(requests)
    check_output(input_path, output, overwrite=overwrite)
    fingerprint = decoder.fingerprint()
    done, prepared = _this_ranks_share(decoder, requests, output, fingerprint, ranks)
    resumed = len(done)
    if ranks.is_main:
        print(f"[seer run] {len(requests)} requests in {input_path}; {resumed} answered in earlier parts; "
              f"{len(requests) - resumed} to decode on {ranks.world_size} rank(s)", file=sys.stderr)
    writer = PartWriter(part_path(output, ranks), fingerprint)
    if command is not None:
        command.start(len(prepared))
        command.outputs.append(str(output))
    bar = tqdm(total=len(prepared), desc=f"seer run (rank 0 of {ranks.world_size})" if ranks.world_size > 1
               else "seer run", disable=not (progress and ranks.is_main), file=sys.stderr)
    mine_speed = Speed()
    try:
        for batch in decoder.batches(prepared):
            records, speed = decoder.decode_batch(batch)
            writer.write([p.request for p in batch], records)
            if command is not None:
                command.advance(len(batch))
                if str(writer.path) not in command.written:
                    command.wrote(writer.path)
            mine_speed.add(speed)
            bar.update(len(batch))
    finally:
        bar.close()
        writer.close()
    speed = Speed.combined(all_gather_objects(mine_speed, ranks))  # also waits for every rank's last batch
    summary = RunSummary(len(requests), resumed, speed, ranks=ranks)
    if ranks.is_main:
        summary.duplicates = merge_parts(output, requests, fingerprint)
        if command is not None:
            command.wrote(output)
        twice = f"; {summary.duplicates} answers held twice (identical) written once" if summary.duplicates else ""
        print(f"[seer run] wrote {output}: {len(requests)} answers ({resumed} from earlier parts){twice}; this "
              f"launch decoded {speed.requests}: {speed.tokens} answer tokens, NFE {speed.nfe}, "
              f"{speed.positions_computed:,} positions computed (positions x layers; summed over "
              f"{ranks.world_size} rank(s)), {speed.wall_s:.3f} s in generate on the slowest rank, "
              f"{speed.tok_per_s:.2f} tok/s", file=sys.stderr)
    return summary
